#include "common/model/config.h"

#include <cmath>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/model/json_util.h"
#include "common/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace trident::model {
namespace {

using internal::JsonSnippet;
using Json = nlohmann::json;

// Upper bounds far beyond any real model, so that NumParameters() and the
// backends' size arithmetic cannot overflow on a hostile config.
constexpr int64_t kMaxHidden = int64_t{1} << 20;
constexpr int64_t kMaxLayers = int64_t{1} << 12;
constexpr int64_t kMaxHeads = int64_t{1} << 12;
constexpr int64_t kMaxHeadDim = int64_t{1} << 12;
constexpr int64_t kMaxIntermediate = int64_t{1} << 22;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxPositions = int64_t{1} << 26;

// Reads typed keys of one JSON object; every error names the file and key.
class Fields {
 public:
  Fields(const Json& object, std::string file) : object_(object), file_(std::move(file)) {}

  const std::string& file() const { return file_; }

  // The value of `key`, or nullptr when absent or null (HF writes null for
  // "use the default").
  const Json* Find(const char* key) const {
    const auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::Status Error(const char* key, absl::string_view problem, const Json* value) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": \"", key, "\" ", problem,
                     value == nullptr ? "" : absl::StrCat(", got ", JsonSnippet(*value))));
  }

  // A required (or, with `fallback`, optional) integer in [1, max].
  absl::StatusOr<int32_t> PositiveInt(const char* key, int64_t max,
                                      absl::optional<int32_t> fallback = absl::nullopt) const {
    const Json* v = Find(key);
    if (v == nullptr) {
      if (fallback.has_value()) return *fallback;
      return Error(key, "is missing", nullptr);
    }
    int64_t i = 0;
    if (!internal::JsonToInt64(*v, &i)) return Error(key, "must be an integer", v);
    if (i < 1 || i > max) return Error(key, absl::StrCat("must be in [1, ", max, "]"), v);
    return static_cast<int32_t>(i);
  }

  // An optional positive finite number.
  absl::StatusOr<double> PositiveNumber(const char* key, double fallback) const {
    const Json* v = Find(key);
    if (v == nullptr) return fallback;
    if (!v->is_number()) return Error(key, "must be a number", v);
    const double d = v->get<double>();
    if (!std::isfinite(d) || d <= 0) return Error(key, "must be positive and finite", v);
    return d;
  }

  absl::StatusOr<bool> Bool(const char* key, bool fallback) const {
    const Json* v = Find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return Error(key, "must be true or false", v);
    return v->get<bool>();
  }

  absl::StatusOr<absl::optional<std::string>> String(const char* key) const {
    const Json* v = Find(key);
    if (v == nullptr) return absl::optional<std::string>();
    if (!v->is_string()) return Error(key, "must be a string", v);
    return absl::optional<std::string>(v->get<std::string>());
  }

  // A token id or list of token ids (eos_token_id), each in [0, vocab_size).
  absl::StatusOr<absl::optional<std::vector<int32_t>>> TokenIds(const char* key,
                                                                int32_t vocab_size) const {
    const Json* v = Find(key);
    if (v == nullptr) return absl::optional<std::vector<int32_t>>();
    std::vector<int32_t> ids;
    auto add = [&](const Json& id) -> absl::Status {
      int64_t i = 0;
      if (!internal::JsonToInt64(id, &i)) {
        return Error(key, "must be an integer or a list of integers", v);
      }
      if (i < 0 || i >= vocab_size) {
        return Error(key, absl::StrCat("must be a token id in [0, ", vocab_size, ")"), &id);
      }
      ids.push_back(static_cast<int32_t>(i));
      return absl::OkStatus();
    };
    if (v->is_array()) {
      for (const Json& id : *v) TRIDENT_RETURN_IF_ERROR(add(id));
    } else {
      TRIDENT_RETURN_IF_ERROR(add(*v));
    }
    return absl::optional<std::vector<int32_t>>(std::move(ids));
  }

 private:
  const Json& object_;
  std::string file_;
};

absl::StatusOr<Json> ParseObject(absl::string_view text, const std::string& file) {
  TRIDENT_ASSIGN_OR_RETURN(Json json, internal::ParseJson(text, file));
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": not a JSON object"));
  }
  return json;
}

struct Architecture {
  const char* architecture;
  const char* model_type;
};
constexpr Architecture kArchitectures[] = {
    {"LlamaForCausalLM", "llama"},
    {"MistralForCausalLM", "mistral"},
    {"Qwen2ForCausalLM", "qwen2"},
};

absl::Status ParseArchitecture(const Fields& f, ModelConfig* config) {
  TRIDENT_ASSIGN_OR_RETURN(const absl::optional<std::string> model_type, f.String("model_type"));
  const Json* archs = f.Find("architectures");
  if (archs != nullptr) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
      return f.Error("architectures", "must be a non-empty list of strings", archs);
    }
    config->architecture = (*archs)[0].get<std::string>();
  } else if (model_type.has_value()) {
    for (const Architecture& a : kArchitectures) {
      if (*model_type == a.model_type) config->architecture = a.architecture;
    }
    if (config->architecture.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(f.file(), ": model_type \"", JsonSnippet(*model_type),
                       "\" is not supported (supported: llama, mistral, qwen2)"));
    }
  } else {
    return f.Error("architectures", "is missing (and so is \"model_type\")", nullptr);
  }
  for (const Architecture& a : kArchitectures) {
    if (config->architecture == a.architecture) {
      config->model_type = model_type.value_or(a.model_type);
      return absl::OkStatus();
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      f.file(), ": architecture \"", JsonSnippet(config->architecture),
      "\" is not supported (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)"));
}

// rope_scaling (or, in newer transformers, rope_parameters, which also holds
// rope_theta).
absl::Status ParseRope(const Fields& f, ModelConfig* config) {
  TRIDENT_ASSIGN_OR_RETURN(config->rope_theta, f.PositiveNumber("rope_theta", 10000.0));
  const char* key = "rope_scaling";
  const Json* scaling = f.Find(key);
  if (scaling == nullptr) {
    key = "rope_parameters";
    scaling = f.Find(key);
  }
  if (scaling == nullptr) return absl::OkStatus();
  if (!scaling->is_object()) return f.Error(key, "must be an object", scaling);
  const Fields s(*scaling, absl::StrCat(f.file(), ": \"", key, "\""));
  TRIDENT_ASSIGN_OR_RETURN(absl::optional<std::string> type, s.String("rope_type"));
  if (!type.has_value()) {
    TRIDENT_ASSIGN_OR_RETURN(type, s.String("type"));
  }
  if (std::string(key) == "rope_parameters") {
    TRIDENT_ASSIGN_OR_RETURN(config->rope_theta,
                             s.PositiveNumber("rope_theta", config->rope_theta));
  }
  if (!type.has_value() || *type == "default") return absl::OkStatus();
  if (*type != "llama3") {
    return absl::FailedPreconditionError(
        absl::StrCat(f.file(), ": rope scaling type \"", JsonSnippet(*type),
                     "\" is not supported (only \"llama3\" and \"default\")"));
  }
  RopeScaling rope;
  rope.rope_type = *type;
  TRIDENT_ASSIGN_OR_RETURN(const double factor, s.PositiveNumber("factor", 0));
  TRIDENT_ASSIGN_OR_RETURN(const double low, s.PositiveNumber("low_freq_factor", 0));
  TRIDENT_ASSIGN_OR_RETURN(const double high, s.PositiveNumber("high_freq_factor", 0));
  if (factor == 0) return s.Error("factor", "is missing", nullptr);
  if (low == 0) return s.Error("low_freq_factor", "is missing", nullptr);
  if (high == 0) return s.Error("high_freq_factor", "is missing", nullptr);
  if (high <= low) {
    return s.Error("high_freq_factor", "must be greater than low_freq_factor",
                   s.Find("high_freq_factor"));
  }
  TRIDENT_ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                           s.PositiveInt("original_max_position_embeddings", kMaxPositions));
  rope.factor = static_cast<float>(factor);
  rope.low_freq_factor = static_cast<float>(low);
  rope.high_freq_factor = static_cast<float>(high);
  config->rope_scaling = rope;
  return absl::OkStatus();
}

absl::Status ParseDType(const Fields& f, ModelConfig* config) {
  const char* key = "torch_dtype";
  TRIDENT_ASSIGN_OR_RETURN(absl::optional<std::string> dtype, f.String(key));
  if (!dtype.has_value()) {
    key = "dtype";
    TRIDENT_ASSIGN_OR_RETURN(dtype, f.String(key));
  }
  if (!dtype.has_value()) return absl::OkStatus();
  if (*dtype == "bfloat16") {
    config->torch_dtype = numeric::DType::kBF16;
  } else if (*dtype == "float16" || *dtype == "half") {
    config->torch_dtype = numeric::DType::kF16;
  } else if (*dtype == "float32" || *dtype == "float") {
    config->torch_dtype = numeric::DType::kF32;
  } else {
    Json value = *dtype;
    return f.Error(key, "must be bfloat16, float16 or float32", &value);
  }
  return absl::OkStatus();
}

absl::Status ParseSlidingWindow(const Fields& f, ModelConfig* config) {
  TRIDENT_ASSIGN_OR_RETURN(const bool use, f.Bool("use_sliding_window", true));
  if (!use || f.Find("sliding_window") == nullptr) return absl::OkStatus();
  TRIDENT_ASSIGN_OR_RETURN(const int32_t window,
                           f.PositiveInt("sliding_window", int64_t{INT32_MAX}));
  if (window >= config->max_position_embeddings) return absl::OkStatus();
  if (config->model_type != "mistral") {
    return absl::FailedPreconditionError(
        absl::StrCat(f.file(), ": sliding window attention (sliding_window ", window,
                     " < max_position_embeddings ", config->max_position_embeddings,
                     ") is supported only for ", "Mistral"));
  }
  config->sliding_window = window;
  return absl::OkStatus();
}

absl::Status ParseTokens(const Fields& f, ModelConfig* config) {
  TRIDENT_ASSIGN_OR_RETURN(const absl::optional<std::vector<int32_t>> bos,
                           f.TokenIds("bos_token_id", config->vocab_size));
  if (bos.has_value()) {
    if (bos->size() != 1)
      return f.Error("bos_token_id", "must be one token id", f.Find("bos_token_id"));
    config->bos_token_id = (*bos)[0];
  }
  TRIDENT_ASSIGN_OR_RETURN(const absl::optional<std::vector<int32_t>> eos,
                           f.TokenIds("eos_token_id", config->vocab_size));
  if (eos.has_value()) config->eos_token_ids = *eos;
  return absl::OkStatus();
}

}  // namespace

int64_t ModelConfig::NumParameters() const {
  const int64_t hidden = hidden_size;
  const int64_t q = int64_t{num_attention_heads} * head_dim;
  const int64_t kv = int64_t{num_key_value_heads} * head_dim;
  const int64_t inter = intermediate_size;
  int64_t layer = 2 * hidden                      // input and post-attention norms
                  + q * hidden + 2 * kv * hidden  // q, k, v
                  + hidden * q                    // o
                  + 3 * inter * hidden;           // gate, up, down
  if (attention_bias) layer += q + 2 * kv;
  if (o_proj_bias) layer += hidden;
  if (mlp_bias) layer += 2 * inter + hidden;
  const int64_t embed = int64_t{vocab_size} * hidden;
  return embed + num_hidden_layers * layer + hidden + (tie_word_embeddings ? 0 : embed);
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view config_json,
                                             absl::string_view generation_config_json,
                                             absl::string_view source) {
  const std::string config_file = absl::StrCat(source, "/config.json");
  TRIDENT_ASSIGN_OR_RETURN(const Json json, ParseObject(config_json, config_file));
  const Fields f(json, config_file);
  ModelConfig config;
  TRIDENT_RETURN_IF_ERROR(ParseArchitecture(f, &config));

  TRIDENT_ASSIGN_OR_RETURN(const absl::optional<std::string> act, f.String("hidden_act"));
  if (act.has_value() && *act != "silu") {
    return absl::FailedPreconditionError(absl::StrCat(
        config_file, ": hidden_act \"", JsonSnippet(*act), "\" is not supported (only silu)"));
  }
  TRIDENT_ASSIGN_OR_RETURN(config.hidden_size, f.PositiveInt("hidden_size", kMaxHidden));
  TRIDENT_ASSIGN_OR_RETURN(config.num_hidden_layers,
                           f.PositiveInt("num_hidden_layers", kMaxLayers));
  TRIDENT_ASSIGN_OR_RETURN(config.num_attention_heads,
                           f.PositiveInt("num_attention_heads", kMaxHeads));
  TRIDENT_ASSIGN_OR_RETURN(
      config.num_key_value_heads,
      f.PositiveInt("num_key_value_heads", kMaxHeads, config.num_attention_heads));
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    return f.Error(
        "num_key_value_heads",
        absl::StrCat("must divide num_attention_heads (", config.num_attention_heads, ")"),
        f.Find("num_key_value_heads"));
  }
  if (f.Find("head_dim") != nullptr) {
    TRIDENT_ASSIGN_OR_RETURN(config.head_dim, f.PositiveInt("head_dim", kMaxHeadDim));
  } else {
    if (config.hidden_size % config.num_attention_heads != 0) {
      return f.Error("hidden_size",
                     absl::StrCat("must be a multiple of num_attention_heads (",
                                  config.num_attention_heads, ") when head_dim is not given"),
                     f.Find("hidden_size"));
    }
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }
  if (config.head_dim % 2 != 0) {
    return f.Error("head_dim", absl::StrCat("must be even for RoPE, got ", config.head_dim),
                   nullptr);
  }
  TRIDENT_ASSIGN_OR_RETURN(config.intermediate_size,
                           f.PositiveInt("intermediate_size", kMaxIntermediate));
  TRIDENT_ASSIGN_OR_RETURN(config.vocab_size, f.PositiveInt("vocab_size", kMaxVocab));
  TRIDENT_ASSIGN_OR_RETURN(config.max_position_embeddings,
                           f.PositiveInt("max_position_embeddings", kMaxPositions));
  TRIDENT_ASSIGN_OR_RETURN(const double eps, f.PositiveNumber("rms_norm_eps", 1e-6));
  if (eps >= 1) return f.Error("rms_norm_eps", "must be below 1", f.Find("rms_norm_eps"));
  config.rms_norm_eps = static_cast<float>(eps);
  TRIDENT_RETURN_IF_ERROR(ParseRope(f, &config));
  TRIDENT_ASSIGN_OR_RETURN(config.tie_word_embeddings, f.Bool("tie_word_embeddings", false));
  if (config.model_type == "qwen2") {
    config.attention_bias = true;
  } else if (config.model_type == "llama") {
    TRIDENT_ASSIGN_OR_RETURN(config.attention_bias, f.Bool("attention_bias", false));
    config.o_proj_bias = config.attention_bias;
    TRIDENT_ASSIGN_OR_RETURN(config.mlp_bias, f.Bool("mlp_bias", false));
  }
  TRIDENT_RETURN_IF_ERROR(ParseDType(f, &config));
  TRIDENT_RETURN_IF_ERROR(ParseSlidingWindow(f, &config));
  TRIDENT_RETURN_IF_ERROR(ParseTokens(f, &config));

  if (!generation_config_json.empty()) {
    const std::string gen_file = absl::StrCat(source, "/generation_config.json");
    TRIDENT_ASSIGN_OR_RETURN(const Json gen, ParseObject(generation_config_json, gen_file));
    TRIDENT_RETURN_IF_ERROR(ParseTokens(Fields(gen, gen_file), &config));
  }
  return config;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  auto read = [](const std::string& path) -> absl::optional<std::string> {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::nullopt;
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const absl::optional<std::string> config = read(dir + "/config.json");
  if (!config.has_value()) {
    return absl::NotFoundError(absl::StrCat("cannot read ", dir, "/config.json"));
  }
  const absl::optional<std::string> generation = read(dir + "/generation_config.json");
  return ParseModelConfig(*config, generation.value_or(""), dir);
}

}  // namespace trident::model
