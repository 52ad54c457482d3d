// A generated model's weights computed on demand, without writing them:
// element for element what WriteModel writes for the same spec (rounded to
// bf16 as a Checkpoint reads them), any block of any tensor computed alone.
// A benchmark and test source: a tensor-parallel rank of a 70B shape loads
// its shard (model/tensor_parallel's ReadShardBf16) without 141 GB on disk.

#ifndef TRIDENT_COMMON_MODEL_GENERATE_RANDOM_WEIGHTS_H_
#define TRIDENT_COMMON_MODEL_GENERATE_RANDOM_WEIGHTS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/model/checkpoint.h"
#include "common/model/config.h"
#include "common/model/generate/model_gen.h"

namespace trident::model::generate {

namespace internal {
struct Plan;
}  // namespace internal

// Thread-safe (every method is const).
class RandomWeights : public TensorReader {
 public:
  // Errors as WriteModel's for the spec.
  static absl::StatusOr<std::unique_ptr<RandomWeights>> Create(const ModelSpec& spec);
  ~RandomWeights() override;

  // What the written config.json would parse to.
  const ModelConfig& config() const { return config_; }

  // As Checkpoint's: kNotFound for a tensor the spec has not; kInvalidArgument
  // for a slice outside the tensor or empty, columns of a 1-D tensor, or an
  // `out` of the wrong size. Info's file is "(generated)"; ReadFloat gives
  // the values as the written file would hold them (bf16-rounded for a bf16
  // spec).
  bool Has(absl::string_view name) const override;
  absl::StatusOr<TensorInfo> Info(absl::string_view name) const override;
  absl::Status ReadFloat(absl::string_view name, absl::Span<float> out) const override;
  absl::Status ReadBf16(absl::string_view name, absl::Span<uint16_t> out) const override;
  absl::Status ReadBf16Slice(absl::string_view name, const TensorSlice& slice,
                             absl::Span<uint16_t> out) const override;
  uint64_t total_bytes() const override { return total_bytes_; }
  // The slice as a counter-based stream (a device computes it in place:
  // kernels/cuda's random_fill); errors as ReadBf16Slice's.
  absl::StatusOr<numeric::CounterStreamBlock> StreamBlock(absl::string_view name,
                                                          const TensorSlice& slice) const override;

 private:
  RandomWeights(ModelSpec spec, std::unique_ptr<internal::Plan> plan, ModelConfig config);

  ModelSpec spec_;
  std::unique_ptr<internal::Plan> plan_;
  ModelConfig config_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> plan_->tensors
  uint64_t total_bytes_ = 0;

  // The planned tensor `name`, or kNotFound.
  absl::StatusOr<size_t> Find(absl::string_view name) const;
  // Calls emit(out index, value) over the slice's elements, row-major, after
  // checking it (StreamBlock) and `out_size`.
  template <typename Emit>
  absl::Status ForEach(absl::string_view name, const TensorSlice& slice, size_t out_size,
                       Emit emit) const;
};

}  // namespace trident::model::generate

#endif  // TRIDENT_COMMON_MODEL_GENERATE_RANDOM_WEIGHTS_H_
