// A model's architecture, read from a Hugging Face model directory's
// `config.json` (and BOS/EOS from `generation_config.json`). Supported:
// LlamaForCausalLM (Llama 2, 3, 3.x, TinyLlama), MistralForCausalLM and
// Qwen2ForCausalLM (Qwen2, Qwen2.5).

#ifndef TRIDENT_COMMON_MODEL_CONFIG_H_
#define TRIDENT_COMMON_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"
#include "common/numeric/dtype.h"

namespace trident::model {

// RoPE frequency scaling. Only Llama 3's scheme ("llama3") is supported; a
// "default" or absent rope_scaling means none (ModelConfig::rope_scaling is
// then empty).
struct RopeScaling {
  std::string rope_type;  // "llama3".
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 1.0f;
  int32_t original_max_position_embeddings = 0;
};

struct ModelConfig {
  std::string architecture;  // "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM".
  std::string model_type;    // "llama", "mistral", "qwen2".
  int32_t hidden_size = 0;
  int32_t num_hidden_layers = 0;
  int32_t num_attention_heads = 0;
  int32_t num_key_value_heads = 0;  // Defaults to num_attention_heads.
  int32_t head_dim = 0;             // Defaults to hidden_size / num_attention_heads.
  int32_t intermediate_size = 0;
  int32_t vocab_size = 0;
  int32_t max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  double rope_theta = 10000.0;
  absl::optional<RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  // q_proj, k_proj and v_proj have biases: always for Qwen2, `attention_bias`
  // for Llama (never for Mistral).
  bool attention_bias = false;
  // o_proj has a bias: only Llama with `attention_bias` (Qwen2's o_proj has none).
  bool o_proj_bias = false;
  bool mlp_bias = false;  // gate/up/down_proj have biases (Llama `mlp_bias`).
  absl::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;                 // Any of them ends generation; may be empty.
  numeric::DType torch_dtype = numeric::DType::kF32;  // HF's default when absent.
  // Set only when a window smaller than max_position_embeddings applies to
  // every layer (Mistral 7B v0.1: 4096); attention then looks back at most
  // this many tokens.
  absl::optional<int32_t> sliding_window;

  // Parameters of the weights, counting lm_head only when untied.
  int64_t NumParameters() const;
};

// Parses config.json (and generation_config.json, which may be empty; where
// it sets bos_token_id / eos_token_id they override config.json's). `source`
// (usually the model directory) prefixes file names in messages. Unknown keys
// are ignored. Returns:
//  - kInvalidArgument, naming the file and key, for invalid JSON, a missing
//    required key, a value of the wrong type (an integer key holding 2.5 or
//    "2"), or out of range (non-positive or absurdly large sizes, heads not
//    divisible by KV heads, hidden_size not divisible by heads without an
//    explicit head_dim, a token id outside the vocabulary, an unknown dtype);
//  - kFailedPrecondition for a valid but unsupported model: another
//    architecture, another activation than silu, a rope_scaling type other
//    than llama3/default (naming it), or an active sliding window outside
//    Mistral (Qwen2 with use_sliding_window).
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view config_json,
                                             absl::string_view generation_config_json,
                                             absl::string_view source);

// Reads `dir`/config.json and, if present, `dir`/generation_config.json.
// kNotFound if config.json is missing; otherwise as ParseModelConfig.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

}  // namespace trident::model

#endif  // TRIDENT_COMMON_MODEL_CONFIG_H_
