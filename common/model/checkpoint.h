// The weights of a Hugging Face model directory: one `model.safetensors`, or a
// sharded set described by `model.safetensors.index.json`, or a single other
// `*.safetensors` file. Every file is mapped read-only and fully validated when
// the checkpoint opens, so reads afterwards fail only for caller errors.

#ifndef TRIDENT_COMMON_MODEL_CHECKPOINT_H_
#define TRIDENT_COMMON_MODEL_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"
#include "absl/types/span.h"
#include "common/model/safetensors.h"
#include "common/numeric/counter_stream.h"
#include "common/numeric/dtype.h"

namespace trident::model {

inline constexpr char kSafetensorsIndexFile[] = "model.safetensors.index.json";
inline constexpr char kSingleSafetensorsFile[] = "model.safetensors";

// Where a tensor lives and what it holds.
struct TensorInfo {
  std::string name;
  std::string file;                      // Path of the safetensors file holding it.
  std::string dtype_name;                // As in the file: "BF16", "F32", "I64", ...
  absl::optional<numeric::DType> dtype;  // Empty for dtypes Trident does not read.
  std::vector<int64_t> shape;
  int64_t numel = 0;
  uint64_t num_bytes = 0;
};

// A block of a tensor: rows [begin, end) of a 2-D tensor (elements of a 1-D
// one), or columns [begin, end) of every row of a 2-D tensor.
enum class SliceAxis { kRows, kColumns };

struct TensorSlice {
  SliceAxis axis = SliceAxis::kRows;
  int64_t begin = 0;
  int64_t end = 0;
};

// Where a model's tensors are read from: a checkpoint on disk, or weights
// computed on demand (model/generate's RandomWeights, which benchmarks load
// large shapes from without writing them). Errors as Checkpoint's.
class TensorReader {
 public:
  virtual ~TensorReader() = default;
  virtual bool Has(absl::string_view name) const = 0;
  virtual absl::StatusOr<TensorInfo> Info(absl::string_view name) const = 0;
  virtual absl::Status ReadFloat(absl::string_view name, absl::Span<float> out) const = 0;
  virtual absl::Status ReadBf16(absl::string_view name, absl::Span<uint16_t> out) const = 0;
  virtual absl::Status ReadBf16Slice(absl::string_view name, const TensorSlice& slice,
                                     absl::Span<uint16_t> out) const = 0;
  // Bytes of every tensor as stored (what loading reads).
  virtual uint64_t total_bytes() const = 0;
  // A reader whose values are computed rather than stored (model/generate's
  // RandomWeights) gives a slice of tensor `name` as a counter-based stream,
  // for a device to compute in the memory it is loaded into, instead of
  // reading it. kUnimplemented for stored tensors (the default).
  virtual absl::StatusOr<numeric::CounterStreamBlock> StreamBlock(absl::string_view name,
                                                                  const TensorSlice& slice) const;
};

// Thread-safe after Open() (every method is const and the mappings are
// read-only).
class Checkpoint : public TensorReader {
 public:
  // Opens the weights in `dir`, choosing, in this order (as `transformers`
  // does): `model.safetensors`; `model.safetensors.index.json`; the only
  // `*.safetensors` file. Returns:
  //  - kNotFound if `dir` or every candidate is missing, or a shard the index
  //    names does not exist (naming the index and the shard);
  //  - kFailedPrecondition if there is no index or model.safetensors but
  //    several *.safetensors files;
  //  - kInvalidArgument for a malformed index (not JSON, no "weight_map"
  //    object, a shard name that is not a plain file name in `dir` such as
  //    "../x" or "a/b", a tensor the index maps to a shard that lacks it, a
  //    tensor present in two shards) or a malformed safetensors file (see
  //    ParseSafetensorsHeader). Messages name the file and the tensor.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::string& dir() const { return dir_; }

  bool Has(absl::string_view name) const override;

  // kNotFound naming the tensor and directory if absent.
  absl::StatusOr<TensorInfo> Info(absl::string_view name) const override;

  // Converts the tensor (F32, BF16 or F16) to f32 / bf16 into `out`, which
  // must hold exactly numel elements. kNotFound if absent; kFailedPrecondition
  // for other dtypes; kInvalidArgument if `out` has the wrong size.
  absl::Status ReadFloat(absl::string_view name, absl::Span<float> out) const override;
  absl::Status ReadBf16(absl::string_view name, absl::Span<uint16_t> out) const override;

  // The same for a slice, read straight from the mapping (a row block is one
  // run of bytes, a column block one run per row): what a tensor-parallel
  // rank loads of its shard, without a copy of the whole tensor. `out` holds
  // the slice row-major. kInvalidArgument for a slice outside the tensor or
  // empty, columns of a tensor that is not 2-D, a tensor of more than two
  // dimensions, or an `out` of the wrong size; otherwise errors as ReadFloat.
  absl::Status ReadFloatSlice(absl::string_view name, const TensorSlice& slice,
                              absl::Span<float> out) const;
  absl::Status ReadBf16Slice(absl::string_view name, const TensorSlice& slice,
                             absl::Span<uint16_t> out) const override;

  // The tensor's bytes as stored (F32, BF16 or F16), valid while this object
  // lives; not necessarily aligned to the element size. Errors as ReadFloat.
  absl::StatusOr<absl::Span<const uint8_t>> RawBytes(absl::string_view name) const;

  // Sum of every tensor's bytes (what loading reads).
  uint64_t total_bytes() const override { return total_bytes_; }

  // Every tensor name, sorted.
  std::vector<std::string> TensorNames() const;

  // Paths of the safetensors files, sorted.
  std::vector<std::string> files() const;

 private:
  struct Entry {
    const SafetensorsFile* file;
    const SafetensorsTensor* tensor;
  };

  explicit Checkpoint(std::string dir) : dir_(std::move(dir)) {}
  absl::StatusOr<Entry> Find(absl::string_view name) const;
  // Finds a readable tensor and checks `out_size` against its numel.
  absl::StatusOr<Entry> FindForRead(absl::string_view name, size_t out_size) const;
  // Reads `slice` of `name` into `out` with `convert` (aligned input).
  template <typename Out, typename Convert>
  absl::Status ReadSlice(absl::string_view name, const TensorSlice& slice, absl::Span<Out> out,
                         Convert convert) const;

  std::string dir_;
  // unique_ptr keeps the addresses that `tensors_` points into stable.
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> tensors_;
  uint64_t total_bytes_ = 0;
};

}  // namespace trident::model

#endif  // TRIDENT_COMMON_MODEL_CHECKPOINT_H_
