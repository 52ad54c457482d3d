// Deterministic random-weight Llama-family model directories in Hugging Face
// layout (config.json, generation_config.json, safetensors, tokenizer.json,
// tokenizer_config.json), for tests, the local cluster and benchmarks.
//
// Every tensor is drawn from its own stream, seeded by (seed, tensor name),
// so the same spec always gives byte-identical files.

#ifndef TRIDENT_COMMON_MODEL_GENERATE_MODEL_GEN_H_
#define TRIDENT_COMMON_MODEL_GENERATE_MODEL_GEN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/numeric/dtype.h"

namespace trident::model::generate {

enum class Family { kLlama3, kQwen2, kMistral };

struct ModelSpec {
  std::string preset;
  Family family = Family::kLlama3;
  // head_dim: the CUDA attention kernels take multiples of 16 up to 256.
  int32_t hidden_size = 256;
  int32_t num_layers = 2;
  int32_t num_heads = 4;
  int32_t num_kv_heads = 2;
  int32_t head_dim = 64;
  int32_t intermediate_size = 704;
  // Rows of the embedding and lm_head; 0 = the tokenizer's size. Larger
  // values pad the vocabulary as many released models do.
  int32_t vocab_size = 0;
  // Tokens the generated tokenizer learns (bytes and specials included).
  int32_t tokenizer_vocab_size = 512;
  int32_t max_position_embeddings = 2048;
  double rope_theta = 500000.0;
  bool llama3_rope_scaling = true;
  int32_t rope_original_max_position = 256;
  bool tie_word_embeddings = true;
  float rms_norm_eps = 1e-5f;
  numeric::DType dtype = numeric::DType::kF32;
  uint64_t seed = 0;
  // 0 writes model.safetensors; otherwise shards of at most this many bytes
  // with model.safetensors.index.json.
  uint64_t max_shard_bytes = 0;
  // False: no safetensors, but generated_weights.json naming the preset,
  // seed and dtype, from which a worker's --generated_weights computes the
  // same weights in memory (RandomWeights; a 70B shape without 141 GB on
  // disk).
  bool write_weights = true;
};

// The file WriteModel writes instead of the weights when !write_weights.
inline constexpr char kGeneratedWeightsFile[] = "generated_weights.json";

// The spec whose weights `dir`'s generated_weights.json names. kNotFound
// naming the file when it is missing; kInvalidArgument for a file that is
// not {"preset": a preset, "seed": n, "dtype": "f32" or "bf16"}.
absl::StatusOr<ModelSpec> GeneratedSpecOf(const std::string& dir);

// Names: llama3-tiny (the default of `trident up` and the tests),
// qwen2-tiny, mistral-tiny, llama-100m (the CPU benchmark model),
// llama3-8b (the shape of Llama-3-8B, for GPU benchmarks), llama3-70b (the
// shape of Llama-3-70B: 141 GB, read through RandomWeights rather than
// written).
absl::StatusOr<ModelSpec> PresetSpec(const std::string& name);
std::vector<std::string> PresetNames();

// Writes the model into `out_dir` (created if missing). Logs progress for
// large models.
absl::Status WriteModel(const ModelSpec& spec, const std::string& out_dir);

}  // namespace trident::model::generate

#endif  // TRIDENT_COMMON_MODEL_GENERATE_MODEL_GEN_H_
