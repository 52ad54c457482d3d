// The Hugging Face tensor names and shapes of a Llama-architecture checkpoint
// (Llama, Mistral, Qwen2), in one place so every backend loads the same
// strings, and a check that a checkpoint holds exactly what its config needs.
//
//   model.embed_tokens.weight                      [vocab, hidden]
//   model.layers.<i>.input_layernorm.weight        [hidden]
//   model.layers.<i>.self_attn.q_proj.weight       [heads * head_dim, hidden]   (+ .bias)
//   model.layers.<i>.self_attn.k_proj.weight       [kv_heads * head_dim, hidden] (+ .bias)
//   model.layers.<i>.self_attn.v_proj.weight       [kv_heads * head_dim, hidden] (+ .bias)
//   model.layers.<i>.self_attn.o_proj.weight       [hidden, heads * head_dim]    (+ .bias)
//   model.layers.<i>.post_attention_layernorm.weight [hidden]
//   model.layers.<i>.mlp.gate_proj.weight          [intermediate, hidden]       (+ .bias)
//   model.layers.<i>.mlp.up_proj.weight            [intermediate, hidden]       (+ .bias)
//   model.layers.<i>.mlp.down_proj.weight          [hidden, intermediate]       (+ .bias)
//   model.norm.weight                              [hidden]
//   lm_head.weight                                 [vocab, hidden]  (absent when tied)
//
// Biases exist as ModelConfig::attention_bias (q/k/v), o_proj_bias and
// mlp_bias say. Weights are [out_features, in_features] (torch Linear).

#ifndef TRIDENT_COMMON_MODEL_LLAMA_WEIGHTS_H_
#define TRIDENT_COMMON_MODEL_LLAMA_WEIGHTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/model/checkpoint.h"
#include "common/model/config.h"

namespace trident::model {

inline constexpr char kEmbedTokensName[] = "model.embed_tokens.weight";
inline constexpr char kFinalNormName[] = "model.norm.weight";
inline constexpr char kLmHeadName[] = "lm_head.weight";

// Suffixes for LayerTensorName().
inline constexpr char kInputLayernorm[] = "input_layernorm.weight";
inline constexpr char kQProj[] = "self_attn.q_proj.weight";
inline constexpr char kKProj[] = "self_attn.k_proj.weight";
inline constexpr char kVProj[] = "self_attn.v_proj.weight";
inline constexpr char kOProj[] = "self_attn.o_proj.weight";
inline constexpr char kQProjBias[] = "self_attn.q_proj.bias";
inline constexpr char kKProjBias[] = "self_attn.k_proj.bias";
inline constexpr char kVProjBias[] = "self_attn.v_proj.bias";
inline constexpr char kOProjBias[] = "self_attn.o_proj.bias";
inline constexpr char kPostAttentionLayernorm[] = "post_attention_layernorm.weight";
inline constexpr char kGateProj[] = "mlp.gate_proj.weight";
inline constexpr char kUpProj[] = "mlp.up_proj.weight";
inline constexpr char kDownProj[] = "mlp.down_proj.weight";
inline constexpr char kGateProjBias[] = "mlp.gate_proj.bias";
inline constexpr char kUpProjBias[] = "mlp.up_proj.bias";
inline constexpr char kDownProjBias[] = "mlp.down_proj.bias";

// "model.layers.<layer>.<suffix>", e.g. LayerTensorName(3, kQProj) is
// "model.layers.3.self_attn.q_proj.weight".
std::string LayerTensorName(int32_t layer, absl::string_view suffix);

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor `config` requires, in a fixed order: embedding, then each
// layer's tensors in the order of the table above, then the final norm and
// lm_head (unless tied).
std::vector<ExpectedTensor> ExpectedLlamaTensors(const ModelConfig& config);

// The tensor's shape as the config requires it, e.g. for kOProj
// {hidden, heads * head_dim}. Returns an empty vector for an unknown suffix.
std::vector<int64_t> LayerTensorShape(const ModelConfig& config, absl::string_view suffix);

// Checks that `checkpoint` holds every ExpectedLlamaTensors(config) tensor
// with that shape, in a dtype Trident reads (F32, BF16, F16), and no other
// per-layer tensor (a bias the config does not mention, a layer beyond
// num_hidden_layers), which would otherwise be silently ignored. Stale
// `rotary_emb.inv_freq` buffers and an lm_head.weight next to tied
// embeddings are tolerated. kFailedPrecondition naming the tensor, the
// expected and actual shapes and the file; OK otherwise.
absl::Status ValidateLlamaCheckpoint(const ModelConfig& config, const Checkpoint& checkpoint);

}  // namespace trident::model

#endif  // TRIDENT_COMMON_MODEL_LLAMA_WEIGHTS_H_
