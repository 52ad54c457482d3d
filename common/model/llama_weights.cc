#include "common/model/llama_weights.h"

#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trident::model {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The per-layer suffixes `config` requires, in load order.
std::vector<const char*> LayerSuffixes(const ModelConfig& config) {
  std::vector<const char*> suffixes = {kInputLayernorm, kQProj, kKProj, kVProj, kOProj};
  if (config.attention_bias) {
    suffixes.insert(suffixes.end(), {kQProjBias, kKProjBias, kVProjBias});
  }
  if (config.o_proj_bias) suffixes.push_back(kOProjBias);
  suffixes.insert(suffixes.end(), {kPostAttentionLayernorm, kGateProj, kUpProj, kDownProj});
  if (config.mlp_bias) suffixes.insert(suffixes.end(), {kGateProjBias, kUpProjBias, kDownProjBias});
  return suffixes;
}

}  // namespace

std::string LayerTensorName(int32_t layer, absl::string_view suffix) {
  return absl::StrCat("model.layers.", layer, ".", suffix);
}

std::vector<int64_t> LayerTensorShape(const ModelConfig& config, absl::string_view suffix) {
  const int64_t hidden = config.hidden_size;
  const int64_t q = int64_t{config.num_attention_heads} * config.head_dim;
  const int64_t kv = int64_t{config.num_key_value_heads} * config.head_dim;
  const int64_t inter = config.intermediate_size;
  if (suffix == kInputLayernorm || suffix == kPostAttentionLayernorm) return {hidden};
  if (suffix == kQProj) return {q, hidden};
  if (suffix == kKProj || suffix == kVProj) return {kv, hidden};
  if (suffix == kOProj) return {hidden, q};
  if (suffix == kQProjBias) return {q};
  if (suffix == kKProjBias || suffix == kVProjBias) return {kv};
  if (suffix == kOProjBias) return {hidden};
  if (suffix == kGateProj || suffix == kUpProj) return {inter, hidden};
  if (suffix == kDownProj) return {hidden, inter};
  if (suffix == kGateProjBias || suffix == kUpProjBias) return {inter};
  if (suffix == kDownProjBias) return {hidden};
  return {};
}

std::vector<ExpectedTensor> ExpectedLlamaTensors(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t vocab = config.vocab_size;
  std::vector<ExpectedTensor> tensors;
  tensors.push_back({kEmbedTokensName, {vocab, hidden}});
  const std::vector<const char*> suffixes = LayerSuffixes(config);
  for (int32_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    for (const char* suffix : suffixes) {
      tensors.push_back({LayerTensorName(layer, suffix), LayerTensorShape(config, suffix)});
    }
  }
  tensors.push_back({kFinalNormName, {hidden}});
  if (!config.tie_word_embeddings) tensors.push_back({kLmHeadName, {vocab, hidden}});
  return tensors;
}

absl::Status ValidateLlamaCheckpoint(const ModelConfig& config, const Checkpoint& checkpoint) {
  std::set<std::string> expected_names;
  for (const ExpectedTensor& expected : ExpectedLlamaTensors(config)) {
    expected_names.insert(expected.name);
    absl::StatusOr<TensorInfo> info = checkpoint.Info(expected.name);
    if (!info.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the checkpoint in ", checkpoint.dir(), " lacks tensor \"", expected.name,
                       "\" (expected shape ", ShapeString(expected.shape), ") that ",
                       config.architecture, " with this config.json needs"));
    }
    if (info->shape != expected.shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor \"", expected.name, "\" in ", info->file, " has shape ", ShapeString(info->shape),
          "; config.json implies ", ShapeString(expected.shape)));
    }
    if (!info->dtype.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat("tensor \"", expected.name, "\" in ",
                                                        info->file, " has dtype ", info->dtype_name,
                                                        "; Trident reads F32, BF16 and F16"));
    }
  }
  for (const std::string& name : checkpoint.TensorNames()) {
    if (absl::StartsWith(name, "model.layers.") && !expected_names.count(name) &&
        !absl::EndsWith(name, ".rotary_emb.inv_freq")) {
      absl::StatusOr<TensorInfo> info = checkpoint.Info(name);
      return absl::FailedPreconditionError(
          absl::StrCat("tensor \"", name, "\" in ", info.ok() ? info->file : checkpoint.dir(),
                       " is not part of ", config.architecture, " with this config.json (",
                       config.num_hidden_layers, " layers, attention_bias ",
                       config.attention_bias ? "true" : "false", ", mlp_bias ",
                       config.mlp_bias ? "true" : "false", ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace trident::model
