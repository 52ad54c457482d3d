// Writes tensors in the safetensors format (https://github.com/huggingface/safetensors):
//
//   [8-byte little-endian u64 N][N bytes of JSON header, space-padded][data]
//
// as one file or as a Hugging Face sharded checkpoint (model-0000K-of-0000N.safetensors
// plus model.safetensors.index.json). Used by the model generator and by tests that
// need checkpoints on disk.

#ifndef TRIDENT_COMMON_MODEL_SAFETENSORS_WRITER_H_
#define TRIDENT_COMMON_MODEL_SAFETENSORS_WRITER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/numeric/dtype.h"

namespace trident::model {

// The safetensors dtype string for `dtype`: "F32", "BF16", "F16".
const char* SafetensorsDTypeName(numeric::DType dtype);

// Collects tensors in memory, then writes them. The header's keys are sorted
// (JSON object order), data is laid out largest element size first, then by
// name (as the reference Rust implementation does), so every tensor starts at
// a multiple of its element size; the header is padded with spaces so the data
// section starts at a multiple of 8, like the Python library.
//
// The header carries `__metadata__` {"format": "pt"} by default, which
// Hugging Face `transformers` expects; AddMetadata() adds or replaces entries.
//
// Thread-compatible.
class SafetensorsWriter {
 public:
  SafetensorsWriter();

  // Adds a tensor. `bytes` holds the elements in row-major order, little-endian,
  // and must be numel(shape) * ElementSize(dtype) long; Write() checks it.
  void Add(std::string name, numeric::DType dtype, std::vector<int64_t> shape, std::string bytes);

  // Convenience: converts `values` to `dtype` (round to nearest even) and adds them.
  void AddFloats(std::string name, numeric::DType dtype, std::vector<int64_t> shape,
                 const std::vector<float>& values);

  void AddMetadata(std::string key, std::string value);

  // The complete file contents. kInvalidArgument if a tensor's byte count does
  // not match its shape, a dimension is negative, or a name repeats or is empty
  // or "__metadata__".
  absl::StatusOr<std::string> Serialize() const;

  // Writes Serialize() to `path` (replacing it). Errors of Serialize(), or the
  // errno-derived status of a failed open/write naming `path`.
  absl::Status Write(const std::string& path) const;

  // Writes the tensors into `dir` (which must exist) as shards of at most
  // `max_shard_bytes` of tensor data each (a tensor larger than that gets a
  // shard of its own), in the order they were added, named
  // model-00001-of-0000N.safetensors ..., plus model.safetensors.index.json:
  //   {"metadata": {"total_size": <sum of tensor bytes>},
  //    "weight_map": {"<tensor>": "<shard file>", ...}}
  // Always writes the index, even for one shard.
  absl::Status WriteSharded(const std::string& dir, uint64_t max_shard_bytes) const;

  size_t num_tensors() const { return tensors_.size(); }

 private:
  struct Tensor {
    std::string name;
    numeric::DType dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };

  // Serializes the tensors with the given indices into one file's bytes.
  absl::StatusOr<std::string> SerializeSubset(const std::vector<size_t>& indices) const;

  std::vector<Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes `contents` to `path`, replacing it. Errors name the path.
absl::Status WriteStringToFile(const std::string& path, const std::string& contents);

}  // namespace trident::model

#endif  // TRIDENT_COMMON_MODEL_SAFETENSORS_WRITER_H_
