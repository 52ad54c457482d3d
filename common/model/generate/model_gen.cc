#include "common/model/generate/model_gen.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging/log.h"
#include "common/model/generate/tensor_plan.h"
#include "common/model/generate/tokenizer_gen.h"
#include "common/model/safetensors_writer.h"
#include "common/numeric/counter_stream.h"
#include "common/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace trident::model::generate {
namespace {

using numeric::DType;

uint64_t NameHash(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

absl::Status WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status MakeDirs(const std::string& dir) {
  std::string partial;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      partial = dir.substr(0, i);
      if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::InternalError(absl::StrCat("cannot create ", partial, ": ", strerror(errno)));
      }
    }
  }
  return absl::OkStatus();
}

TokenizerStyle StyleOf(Family f) {
  switch (f) {
    case Family::kLlama3:
      return TokenizerStyle::kLlama3;
    case Family::kQwen2:
      return TokenizerStyle::kQwen2;
    case Family::kMistral:
      return TokenizerStyle::kLlama2;
  }
  return TokenizerStyle::kLlama3;
}

nlohmann::json ConfigJson(const ModelSpec& s, int32_t vocab, const GeneratedTokenizer& tok) {
  nlohmann::json c;
  c["hidden_act"] = "silu";
  c["hidden_size"] = s.hidden_size;
  c["intermediate_size"] = s.intermediate_size;
  c["num_hidden_layers"] = s.num_layers;
  c["num_attention_heads"] = s.num_heads;
  c["num_key_value_heads"] = s.num_kv_heads;
  c["head_dim"] = s.head_dim;
  c["max_position_embeddings"] = s.max_position_embeddings;
  c["rms_norm_eps"] = s.rms_norm_eps;
  c["rope_theta"] = s.rope_theta;
  c["tie_word_embeddings"] = s.tie_word_embeddings;
  c["vocab_size"] = vocab;
  c["initializer_range"] = 0.02;
  c["attention_dropout"] = 0.0;
  c["use_cache"] = true;
  c["torch_dtype"] = s.dtype == DType::kBF16 ? "bfloat16" : "float32";
  if (tok.bos_id >= 0) {
    c["bos_token_id"] = tok.bos_id;
  } else {
    c["bos_token_id"] = nullptr;
  }
  if (tok.eos_ids.size() == 1) {
    c["eos_token_id"] = tok.eos_ids[0];
  } else {
    c["eos_token_id"] = tok.eos_ids;
  }
  switch (s.family) {
    case Family::kLlama3:
      c["architectures"] = {"LlamaForCausalLM"};
      c["model_type"] = "llama";
      c["attention_bias"] = false;
      c["mlp_bias"] = false;
      c["pretraining_tp"] = 1;
      if (s.llama3_rope_scaling) {
        c["rope_scaling"] = {{"rope_type", "llama3"},
                             {"factor", 8.0},
                             {"low_freq_factor", 1.0},
                             {"high_freq_factor", 4.0},
                             {"original_max_position_embeddings", s.rope_original_max_position}};
      } else {
        c["rope_scaling"] = nullptr;
      }
      break;
    case Family::kQwen2:
      c["architectures"] = {"Qwen2ForCausalLM"};
      c["model_type"] = "qwen2";
      c["use_sliding_window"] = false;
      c["sliding_window"] = nullptr;
      c["max_window_layers"] = s.num_layers;
      c["rope_scaling"] = nullptr;
      break;
    case Family::kMistral:
      c["architectures"] = {"MistralForCausalLM"};
      c["model_type"] = "mistral";
      c["sliding_window"] = nullptr;
      c["rope_scaling"] = nullptr;
      break;
  }
  return c;
}

}  // namespace

std::vector<std::string> PresetNames() {
  return {"llama3-tiny", "qwen2-tiny", "mistral-tiny", "llama-100m", "llama3-8b", "llama3-70b"};
}

absl::StatusOr<ModelSpec> PresetSpec(const std::string& name) {
  ModelSpec s;
  s.preset = name;
  if (name == "llama3-tiny") {
    // Untied, as Llama 3 8B/70B.
    s.tie_word_embeddings = false;
    return s;
  }
  if (name == "qwen2-tiny") {
    s.family = Family::kQwen2;
    s.rope_theta = 1000000.0;
    s.llama3_rope_scaling = false;
    // Tied, as Qwen2.5-0.5B.
    s.tie_word_embeddings = true;
    s.rms_norm_eps = 1e-6f;
    s.intermediate_size = 640;
    s.seed = 1;
    return s;
  }
  if (name == "mistral-tiny") {
    s.family = Family::kMistral;
    s.num_heads = 4;
    s.num_kv_heads = 1;  // GQA 4
    s.num_layers = 3;
    s.rope_theta = 10000.0;
    s.llama3_rope_scaling = false;
    s.tie_word_embeddings = false;
    s.tokenizer_vocab_size = 640;
    s.seed = 2;
    return s;
  }
  if (name == "llama-100m") {
    s.hidden_size = 768;
    s.num_layers = 12;
    s.num_heads = 12;
    s.num_kv_heads = 4;
    s.head_dim = 64;
    s.intermediate_size = 2048;
    s.vocab_size = 32000;
    s.tokenizer_vocab_size = 1024;
    s.rope_original_max_position = 8192;
    s.max_position_embeddings = 8192;
    s.tie_word_embeddings = false;
    s.seed = 3;
    return s;
  }
  if (name == "llama3-8b") {
    s.hidden_size = 4096;
    s.num_layers = 32;
    s.num_heads = 32;
    s.num_kv_heads = 8;
    s.head_dim = 128;
    s.intermediate_size = 14336;
    s.vocab_size = 128256;
    s.tokenizer_vocab_size = 1024;
    s.rope_original_max_position = 8192;
    s.max_position_embeddings = 131072;
    s.tie_word_embeddings = false;
    s.dtype = DType::kBF16;
    s.max_shard_bytes = 5ull << 30;
    s.seed = 4;
    return s;
  }
  if (name == "llama3-70b") {
    // Llama-3-8B's settings at Llama-3-70B's sizes. 141 GB in bf16:
    // benchmarks load its shards through RandomWeights.
    absl::StatusOr<ModelSpec> base = PresetSpec("llama3-8b");
    if (!base.ok()) return base.status();
    s = *base;
    s.preset = name;
    s.hidden_size = 8192;
    s.num_layers = 80;
    s.num_heads = 64;
    s.intermediate_size = 28672;
    s.seed = 5;
    return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown preset \"", name, "\"; presets: ", absl::StrJoin(PresetNames(), ", ")));
}

namespace internal {

numeric::CounterStreamBlock TensorBlock(const Plan& plan, const PlannedTensor& t, uint64_t seed,
                                        int64_t row0, int64_t col0, int64_t rows, int64_t cols) {
  numeric::CounterStreamBlock block;
  block.base = numeric::SplitMix64(seed ^ NameHash(t.name));
  block.mean = t.mean;
  block.half_width = t.stddev * std::sqrt(3.0f);
  block.tensor_cols = t.cols();
  block.row0 = row0;
  block.col0 = col0;
  block.rows = rows;
  block.cols = cols;
  if (t.vocab_rows) {  // Rows are token ids: those of partial characters scaled.
    block.quarter_rows.resize(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      block.quarter_rows[static_cast<size_t>(r)] =
          plan.partial_utf8[static_cast<size_t>(row0 + r)] ? 1 : 0;
    }
  }
  return block;
}

absl::StatusOr<Plan> MakePlan(const ModelSpec& s) {
  if (s.hidden_size <= 0 || s.num_layers <= 0 || s.num_heads <= 0 || s.num_kv_heads <= 0 ||
      s.head_dim <= 0 || s.intermediate_size <= 0 || s.num_heads % s.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        "model spec: sizes must be positive and num_heads a "
        "multiple of num_kv_heads");
  }
  Plan plan;
  TRIDENT_ASSIGN_OR_RETURN(plan.tokenizer,
                           GenerateTokenizer(StyleOf(s.family), s.tokenizer_vocab_size));
  const GeneratedTokenizer& tok = plan.tokenizer;
  const int32_t vocab = s.vocab_size > 0 ? s.vocab_size : tok.vocab_size;
  if (vocab < tok.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size ", vocab, " is smaller than the tokenizer's ", tok.vocab_size));
  }
  plan.vocab = vocab;
  plan.partial_utf8.assign(static_cast<size_t>(vocab), false);
  for (int32_t id : tok.partial_utf8_ids) plan.partial_utf8[static_cast<size_t>(id)] = true;
  plan.config = ConfigJson(s, vocab, tok);
  const int64_t h = s.hidden_size;
  const int64_t q_out = static_cast<int64_t>(s.num_heads) * s.head_dim;
  const int64_t kv_out = static_cast<int64_t>(s.num_kv_heads) * s.head_dim;
  const int64_t inter = s.intermediate_size;
  auto add = [&](std::string name, std::vector<int64_t> shape, float mean, float stddev,
                 bool vocab_rows = false) {
    plan.tensors.push_back({std::move(name), std::move(shape), mean, stddev, vocab_rows});
  };
  const float in_h = 1.0f / std::sqrt(static_cast<float>(h));
  // Logits get a standard deviation near 4 (tied or not), which keeps greedy
  // choices well separated from rounding noise.
  const float embed_std = s.tie_word_embeddings ? 4.0f * in_h : 1.0f;
  add("model.embed_tokens.weight", {vocab, h}, 0.0f, embed_std, true);
  for (int32_t l = 0; l < s.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "input_layernorm.weight", {h}, 1.0f, 0.1f);
    add(p + "self_attn.q_proj.weight", {q_out, h}, 0.0f, in_h);
    add(p + "self_attn.k_proj.weight", {kv_out, h}, 0.0f, in_h);
    add(p + "self_attn.v_proj.weight", {kv_out, h}, 0.0f, in_h);
    if (s.family == Family::kQwen2) {
      add(p + "self_attn.q_proj.bias", {q_out}, 0.0f, 0.2f);
      add(p + "self_attn.k_proj.bias", {kv_out}, 0.0f, 0.2f);
      add(p + "self_attn.v_proj.bias", {kv_out}, 0.0f, 0.2f);
    }
    add(p + "self_attn.o_proj.weight", {h, q_out}, 0.0f,
        1.0f / std::sqrt(static_cast<float>(q_out)));
    add(p + "post_attention_layernorm.weight", {h}, 1.0f, 0.1f);
    add(p + "mlp.gate_proj.weight", {inter, h}, 0.0f, in_h);
    add(p + "mlp.up_proj.weight", {inter, h}, 0.0f, in_h);
    add(p + "mlp.down_proj.weight", {h, inter}, 0.0f, 1.0f / std::sqrt(static_cast<float>(inter)));
  }
  add("model.norm.weight", {h}, 1.0f, 0.1f);
  if (!s.tie_word_embeddings) add("lm_head.weight", {vocab, h}, 0.0f, 4.0f * in_h, true);
  return plan;
}

}  // namespace internal

absl::StatusOr<ModelSpec> GeneratedSpecOf(const std::string& dir) {
  const std::string path = dir + "/" + kGeneratedWeightsFile;
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path, " not found: write it with make_model --weights=false"));
  }
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("preset") || !j["preset"].is_string() || !j.contains("seed") ||
      !j["seed"].is_number_unsigned() || !j.contains("dtype") || !j["dtype"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": want {\"preset\": name, \"seed\": n, \"dtype\": \"f32\" or \"bf16\"}"));
  }
  TRIDENT_ASSIGN_OR_RETURN(ModelSpec spec, PresetSpec(j["preset"].get<std::string>()));
  spec.seed = j["seed"].get<uint64_t>();
  const std::string dtype = j["dtype"].get<std::string>();
  if (dtype != "f32" && dtype != "bf16") {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": dtype \"", dtype, "\" is not f32 or bf16"));
  }
  spec.dtype = dtype == "f32" ? numeric::DType::kF32 : numeric::DType::kBF16;
  return spec;
}

namespace {

absl::Status WriteWeights(const ModelSpec& s, const internal::Plan& plan,
                          const std::string& out_dir) {
  if (!s.write_weights) {
    nlohmann::json marker;
    marker["preset"] = s.preset;
    marker["seed"] = s.seed;
    marker["dtype"] = s.dtype == numeric::DType::kF32 ? "f32" : "bf16";
    TRIDENT_LOG(INFO) << "writing " << s.preset << "'s config and tokenizer to " << out_dir
                      << "; its weights are computed where they are loaded";
    return WriteFile(out_dir + "/" + kGeneratedWeightsFile, marker.dump(2) + "\n");
  }
  model::SafetensorsWriter writer;
  uint64_t total_params = 0;
  for (const internal::PlannedTensor& t : plan.tensors) {
    std::vector<float> values;
    values.reserve(static_cast<size_t>(t.rows() * t.cols()));
    const numeric::CounterStreamBlock block =
        internal::TensorBlock(plan, t, s.seed, 0, 0, t.rows(), t.cols());
    for (int64_t r = 0; r < t.rows(); ++r) {
      for (int64_t c = 0; c < t.cols(); ++c) values.push_back(numeric::BlockElement(block, r, c));
    }
    total_params += values.size();
    writer.AddFloats(t.name, s.dtype, t.shape, std::move(values));
  }
  writer.AddMetadata("format", "pt");

  TRIDENT_LOG(INFO) << "writing " << (s.preset.empty() ? "model" : s.preset) << " (" << total_params
                    << " parameters, " << numeric::DTypeName(s.dtype) << ") to " << out_dir;
  if (s.max_shard_bytes > 0) return writer.WriteSharded(out_dir, s.max_shard_bytes);
  return writer.Write(out_dir + "/model.safetensors");
}

}  // namespace

absl::Status WriteModel(const ModelSpec& s, const std::string& out_dir) {
  TRIDENT_ASSIGN_OR_RETURN(internal::Plan plan, internal::MakePlan(s));
  const GeneratedTokenizer& tok = plan.tokenizer;
  TRIDENT_RETURN_IF_ERROR(MakeDirs(out_dir));
  TRIDENT_RETURN_IF_ERROR(WriteWeights(s, plan, out_dir));
  TRIDENT_RETURN_IF_ERROR(WriteFile(out_dir + "/config.json", plan.config.dump(2) + "\n"));
  nlohmann::json gen;
  if (tok.bos_id >= 0) gen["bos_token_id"] = tok.bos_id;
  if (tok.eos_ids.size() == 1) {
    gen["eos_token_id"] = tok.eos_ids[0];
  } else {
    gen["eos_token_id"] = tok.eos_ids;
  }
  gen["do_sample"] = false;
  TRIDENT_RETURN_IF_ERROR(WriteFile(out_dir + "/generation_config.json", gen.dump(2) + "\n"));
  TRIDENT_RETURN_IF_ERROR(WriteFile(out_dir + "/tokenizer.json", tok.tokenizer_json));
  TRIDENT_RETURN_IF_ERROR(WriteFile(out_dir + "/tokenizer_config.json", tok.tokenizer_config_json));
  return absl::OkStatus();
}

}  // namespace trident::model::generate
