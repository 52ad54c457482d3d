#include "common/model/config.h"

#include <sys/stat.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace trident::model {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr absl::StatusCode kUnsupported = absl::StatusCode::kFailedPrecondition;

// config.json files as published on the Hugging Face Hub.
constexpr char kLlama2_7b[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

constexpr char kLlama31_8bInstruct[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3",
  "use_cache": true,
  "vocab_size": 128256
})";

constexpr char kLlama31GenerationConfig[] = R"({
  "bos_token_id": 128000,
  "do_sample": true,
  "eos_token_id": [128001, 128008, 128009],
  "temperature": 0.6,
  "top_p": 0.9,
  "transformers_version": "4.42.3"
})";

constexpr char kLlama32_1b[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

constexpr char kMistral7bV01[] = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.34.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

constexpr char kMistral7bInstructV03[] = R"({
  "architectures": ["MistralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.0.dev0",
  "use_cache": true,
  "vocab_size": 32768
})";

constexpr char kQwen25_05bInstruct[] = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 21,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

constexpr char kQwen25GenerationConfig[] = R"({
  "bos_token_id": 151643,
  "pad_token_id": 151643,
  "do_sample": true,
  "eos_token_id": [151645, 151643],
  "repetition_penalty": 1.1,
  "temperature": 0.7,
  "top_p": 0.8,
  "top_k": 20,
  "transformers_version": "4.37.0"
})";

constexpr char kTinyLlamaChat[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 2048,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 22,
  "num_key_value_heads": 4,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.35.0",
  "use_cache": true,
  "vocab_size": 32000
})";

absl::StatusOr<ModelConfig> Parse(absl::string_view config, absl::string_view generation = "") {
  return ParseModelConfig(config, generation, "/models/m");
}

// kTinyLlamaChat with `key` set to the JSON `value` (or removed when empty).
std::string TinyLlamaWith(const std::string& key, const std::string& value) {
  nlohmann::json json = nlohmann::json::parse(kTinyLlamaChat);
  if (value.empty()) {
    json.erase(key);
  } else {
    json[key] = nlohmann::json::parse(value);
  }
  return json.dump();
}

TEST(ParseModelConfigTest, Llama2) {
  absl::StatusOr<ModelConfig> c = Parse(kLlama2_7b);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->num_hidden_layers, 32);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 32);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->intermediate_size, 11008);
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->max_position_embeddings, 4096);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->rope_scaling.has_value());
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->o_proj_bias);
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2));
  EXPECT_EQ(c->torch_dtype, numeric::DType::kF16);
  EXPECT_FALSE(c->sliding_window.has_value());
  EXPECT_EQ(c->NumParameters(), 6'738'415'616);
}

TEST(ParseModelConfigTest, Llama31WithLlama3RopeScaling) {
  absl::StatusOr<ModelConfig> c = Parse(kLlama31_8bInstruct, kLlama31GenerationConfig);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->rope_theta, 500000.0);
  ASSERT_TRUE(c->rope_scaling.has_value());
  EXPECT_EQ(c->rope_scaling->rope_type, "llama3");
  EXPECT_EQ(c->rope_scaling->factor, 8.0f);
  EXPECT_EQ(c->rope_scaling->low_freq_factor, 1.0f);
  EXPECT_EQ(c->rope_scaling->high_freq_factor, 4.0f);
  EXPECT_EQ(c->rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_EQ(c->torch_dtype, numeric::DType::kBF16);
  EXPECT_EQ(c->NumParameters(), 8'030'261'248);
}

TEST(ParseModelConfigTest, Llama32WithExplicitHeadDimAndTiedEmbeddings) {
  absl::StatusOr<ModelConfig> c = Parse(kLlama32_1b);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->rope_scaling->factor, 32.0f);
  EXPECT_EQ(c->NumParameters(), 1'235'814'400);
}

TEST(ParseModelConfigTest, MistralV01RecordsSlidingWindow) {
  absl::StatusOr<ModelConfig> c = Parse(kMistral7bV01);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->architecture, "MistralForCausalLM");
  EXPECT_EQ(c->model_type, "mistral");
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->NumParameters(), 7'241'732'096);
}

TEST(ParseModelConfigTest, MistralV03HasNoSlidingWindow) {
  absl::StatusOr<ModelConfig> c = Parse(kMistral7bInstructV03);
  ASSERT_THAT(c, IsOk());
  EXPECT_FALSE(c->sliding_window.has_value());
  EXPECT_EQ(c->vocab_size, 32768);
  EXPECT_EQ(c->rope_theta, 1e6);
}

TEST(ParseModelConfigTest, MistralWindowAsLongAsContextIsInactive) {
  std::string config = absl::StrReplaceAll(
      kMistral7bV01, {{"\"sliding_window\": 4096", "\"sliding_window\": 32768"}});
  absl::StatusOr<ModelConfig> c = Parse(config);
  ASSERT_THAT(c, IsOk());
  EXPECT_FALSE(c->sliding_window.has_value());
}

TEST(ParseModelConfigTest, Qwen25HasQkvBiasAndGenerationConfigEos) {
  absl::StatusOr<ModelConfig> c = Parse(kQwen25_05bInstruct, kQwen25GenerationConfig);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c->model_type, "qwen2");
  EXPECT_TRUE(c->attention_bias);
  EXPECT_FALSE(c->o_proj_bias);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_FALSE(c->sliding_window.has_value());  // use_sliding_window is false.
  EXPECT_EQ(c->bos_token_id, 151643);
  // generation_config.json overrides config.json's single eos.
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151645, 151643));
  EXPECT_EQ(c->NumParameters(), 494'032'768);
}

TEST(ParseModelConfigTest, TinyLlama) {
  absl::StatusOr<ModelConfig> c = Parse(kTinyLlamaChat);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->num_hidden_layers, 22);
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->NumParameters(), 1'100'048'384);
}

TEST(ParseModelConfigTest, AppliesDefaults) {
  const std::string minimal = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
      "vocab_size": 100, "max_position_embeddings": 256})";
  absl::StatusOr<ModelConfig> c = Parse(minimal);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->torch_dtype, numeric::DType::kF32);
  EXPECT_FALSE(c->bos_token_id.has_value());
  EXPECT_TRUE(c->eos_token_ids.empty());
}

TEST(ParseModelConfigTest, AcceptsDtypeKeyModelTypeOnlyAndDefaultRope) {
  absl::StatusOr<ModelConfig> c = Parse(TinyLlamaWith("torch_dtype", ""));
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->torch_dtype, numeric::DType::kF32);
  c = Parse(TinyLlamaWith("dtype", R"("float16")"));
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->torch_dtype, numeric::DType::kBF16);  // torch_dtype wins.
  nlohmann::json json = nlohmann::json::parse(kTinyLlamaChat);
  json.erase("torch_dtype");
  json.erase("architectures");
  json["dtype"] = "float16";
  json["rope_scaling"] = {{"rope_type", "default"}};
  c = Parse(json.dump());
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->torch_dtype, numeric::DType::kF16);
  EXPECT_FALSE(c->rope_scaling.has_value());
}

TEST(ParseModelConfigTest, ExplicitHeadDimNeedNotDivideHidden) {
  // Mistral-Nemo style: 32 heads of 128 with hidden 5120.
  nlohmann::json json = nlohmann::json::parse(kMistral7bInstructV03);
  json["hidden_size"] = 5120;
  json["head_dim"] = 128;
  absl::StatusOr<ModelConfig> c = Parse(json.dump());
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->head_dim, 128);
}

TEST(ParseModelConfigTest, RejectsUnsupportedArchitecture) {
  EXPECT_THAT(Parse(TinyLlamaWith("architectures", R"(["GPT2LMHeadModel"])")),
              StatusIs(kUnsupported,
                       AllOf(HasSubstr("/models/m/config.json"), HasSubstr("GPT2LMHeadModel"))));
  nlohmann::json json = nlohmann::json::parse(kTinyLlamaChat);
  json.erase("architectures");
  json["model_type"] = "gemma";
  EXPECT_THAT(Parse(json.dump()), StatusIs(kUnsupported, HasSubstr("gemma")));
  EXPECT_THAT(Parse(TinyLlamaWith("hidden_act", R"("gelu")")),
              StatusIs(kUnsupported, HasSubstr("gelu")));
}

TEST(ParseModelConfigTest, RejectsUnsupportedRopeScaling) {
  for (const char* type : {"linear", "dynamic", "yarn", "longrope"}) {
    EXPECT_THAT(Parse(TinyLlamaWith("rope_scaling", absl::StrCat(R"({"rope_type": ")", type,
                                                                 R"(", "factor": 2.0})"))),
                StatusIs(kUnsupported, AllOf(HasSubstr(type), HasSubstr("config.json"))));
  }
  // The older "type" key.
  EXPECT_THAT(Parse(TinyLlamaWith("rope_scaling", R"({"type": "linear", "factor": 2.0})")),
              StatusIs(kUnsupported, HasSubstr("\"linear\"")));
}

TEST(ParseModelConfigTest, RejectsIncompleteLlama3RopeScaling) {
  EXPECT_THAT(Parse(TinyLlamaWith("rope_scaling", R"({"rope_type": "llama3", "factor": 8.0,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0})")),
              StatusIs(kInvalid, HasSubstr("original_max_position_embeddings")));
  EXPECT_THAT(Parse(TinyLlamaWith("rope_scaling", R"({"rope_type": "llama3", "factor": 8.0,
          "low_freq_factor": 4.0, "high_freq_factor": 1.0, "original_max_position_embeddings": 8})")),
              StatusIs(kInvalid, HasSubstr("high_freq_factor")));
  EXPECT_THAT(Parse(TinyLlamaWith("rope_scaling", R"("llama3")")),
              StatusIs(kInvalid, HasSubstr("rope_scaling")));
}

TEST(ParseModelConfigTest, RejectsActiveSlidingWindowOutsideMistral) {
  nlohmann::json json = nlohmann::json::parse(kQwen25_05bInstruct);
  json["use_sliding_window"] = true;
  json["sliding_window"] = 4096;
  EXPECT_THAT(Parse(json.dump()), StatusIs(kUnsupported, HasSubstr("sliding window")));
}

TEST(ParseModelConfigTest, RejectsMissingOrMistypedSizes) {
  EXPECT_THAT(Parse(TinyLlamaWith("hidden_size", "")),
              StatusIs(kInvalid, AllOf(HasSubstr("/models/m/config.json"),
                                       HasSubstr("\"hidden_size\" is missing"))));
  EXPECT_THAT(Parse(TinyLlamaWith("hidden_size", R"("2048")")),
              StatusIs(kInvalid, HasSubstr("\"hidden_size\" must be an integer")));
  EXPECT_THAT(Parse(TinyLlamaWith("num_hidden_layers", "22.5")),
              StatusIs(kInvalid, HasSubstr("\"num_hidden_layers\" must be an integer")));
  EXPECT_THAT(Parse(TinyLlamaWith("vocab_size", "0")),
              StatusIs(kInvalid, HasSubstr("\"vocab_size\" must be in [1, ")));
  EXPECT_THAT(Parse(TinyLlamaWith("intermediate_size", "-5")),
              StatusIs(kInvalid, HasSubstr("\"intermediate_size\"")));
  EXPECT_THAT(Parse(TinyLlamaWith("num_hidden_layers", "1000000000000")),
              StatusIs(kInvalid, HasSubstr("\"num_hidden_layers\" must be in")));
  EXPECT_THAT(Parse(TinyLlamaWith("rms_norm_eps", "-1e-5")),
              StatusIs(kInvalid, HasSubstr("\"rms_norm_eps\"")));
  EXPECT_THAT(Parse(TinyLlamaWith("rope_theta", R"("big")")),
              StatusIs(kInvalid, HasSubstr("\"rope_theta\" must be a number")));
  EXPECT_THAT(Parse(TinyLlamaWith("tie_word_embeddings", "1")),
              StatusIs(kInvalid, HasSubstr("\"tie_word_embeddings\"")));
}

TEST(ParseModelConfigTest, RejectsInconsistentHeads) {
  EXPECT_THAT(Parse(TinyLlamaWith("num_key_value_heads", "5")),
              StatusIs(kInvalid, HasSubstr("\"num_key_value_heads\" must divide")));
  EXPECT_THAT(Parse(TinyLlamaWith("hidden_size", "2047")),
              StatusIs(kInvalid, HasSubstr("\"hidden_size\" must be a multiple")));
  EXPECT_THAT(Parse(TinyLlamaWith("head_dim", "63")), StatusIs(kInvalid, HasSubstr("even")));
}

TEST(ParseModelConfigTest, RejectsBadTokenIdsAndDtype) {
  EXPECT_THAT(Parse(TinyLlamaWith("eos_token_id", "32000")),
              StatusIs(kInvalid, AllOf(HasSubstr("\"eos_token_id\""), HasSubstr("[0, 32000)"))));
  EXPECT_THAT(Parse(TinyLlamaWith("eos_token_id", R"([2, "3"])")),
              StatusIs(kInvalid, HasSubstr("\"eos_token_id\"")));
  EXPECT_THAT(Parse(TinyLlamaWith("bos_token_id", "[1, 2]")),
              StatusIs(kInvalid, HasSubstr("\"bos_token_id\" must be one token id")));
  EXPECT_THAT(Parse(TinyLlamaWith("torch_dtype", R"("int8")")),
              StatusIs(kInvalid, AllOf(HasSubstr("\"torch_dtype\""), HasSubstr("int8"))));
  EXPECT_THAT(Parse(kTinyLlamaChat, R"({"eos_token_id": -1})"),
              StatusIs(kInvalid, AllOf(HasSubstr("/models/m/generation_config.json"),
                                       HasSubstr("\"eos_token_id\""))));
}

TEST(ParseModelConfigTest, RejectsInvalidJson) {
  EXPECT_THAT(
      Parse("{\"hidden_size\": "),
      StatusIs(kInvalid, AllOf(HasSubstr("/models/m/config.json"), HasSubstr("not valid JSON"))));
  EXPECT_THAT(Parse("[]"), StatusIs(kInvalid, HasSubstr("not a JSON object")));
  EXPECT_THAT(Parse(kTinyLlamaChat, "{"),
              StatusIs(kInvalid, HasSubstr("/models/m/generation_config.json")));
  EXPECT_THAT(Parse(R"({"hidden_size": 1, "hidden_size": 2})"),
              StatusIs(kInvalid, HasSubstr("appears twice")));
}

TEST(LoadModelConfigTest, ReadsConfigAndGenerationConfigFromDirectory) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/qwen");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  EXPECT_THAT(LoadModelConfig(dir),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir + "/config.json")));
  {
    FILE* f = fopen((dir + "/config.json").c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs(kQwen25_05bInstruct, f);
    fclose(f);
  }
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir);
  ASSERT_THAT(c, IsOk());
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151645));
  {
    FILE* f = fopen((dir + "/generation_config.json").c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs(kQwen25GenerationConfig, f);
    fclose(f);
  }
  c = LoadModelConfig(dir);
  ASSERT_THAT(c, IsOk());
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151645, 151643));
}

}  // namespace
}  // namespace trident::model
