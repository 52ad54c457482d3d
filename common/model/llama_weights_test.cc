#include "common/model/llama_weights.h"

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/checkpoint.h"
#include "common/model/config.h"
#include "common/model/safetensors_writer.h"
#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::model {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr absl::StatusCode kUnsupported = absl::StatusCode::kFailedPrecondition;

ModelConfig TinyConfig() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.hidden_size = 8;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.intermediate_size = 12;
  c.vocab_size = 10;
  c.max_position_embeddings = 32;
  return c;
}

// Writes a checkpoint holding ExpectedLlamaTensors(config) (zeros, bf16) with
// the given names dropped, shapes replaced and extra tensors added.
std::string WriteModel(const ModelConfig& config, const std::vector<std::string>& drop = {},
                       const std::map<std::string, std::vector<int64_t>>& reshape = {},
                       const std::map<std::string, std::vector<int64_t>>& extra = {}) {
  const std::string dir = absl::StrCat(
      ::testing::TempDir(), "/", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  EXPECT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
  SafetensorsWriter writer;
  auto add = [&](const std::string& name, const std::vector<int64_t>& shape) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    writer.Add(name, numeric::DType::kBF16, shape, std::string(2 * numel, '\0'));
  };
  for (const ExpectedTensor& t : ExpectedLlamaTensors(config)) {
    if (std::find(drop.begin(), drop.end(), t.name) != drop.end()) continue;
    const auto it = reshape.find(t.name);
    add(t.name, it == reshape.end() ? t.shape : it->second);
  }
  for (const auto& [name, shape] : extra) add(name, shape);
  EXPECT_THAT(writer.WriteSharded(dir, /*max_shard_bytes=*/1024), IsOk());
  return dir;
}

absl::Status Validate(const ModelConfig& config, const std::string& dir) {
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  if (!checkpoint.ok()) return checkpoint.status();
  return ValidateLlamaCheckpoint(config, **checkpoint);
}

TEST(LlamaWeightsTest, NamesAndShapes) {
  EXPECT_EQ(LayerTensorName(3, kQProj), "model.layers.3.self_attn.q_proj.weight");
  EXPECT_EQ(LayerTensorName(0, kDownProj), "model.layers.0.mlp.down_proj.weight");
  const ModelConfig c = TinyConfig();
  EXPECT_THAT(LayerTensorShape(c, kQProj), ElementsAre(8, 8));
  EXPECT_THAT(LayerTensorShape(c, kKProj), ElementsAre(4, 8));
  EXPECT_THAT(LayerTensorShape(c, kOProj), ElementsAre(8, 8));
  EXPECT_THAT(LayerTensorShape(c, kGateProj), ElementsAre(12, 8));
  EXPECT_THAT(LayerTensorShape(c, kDownProj), ElementsAre(8, 12));
  EXPECT_THAT(LayerTensorShape(c, kVProjBias), ElementsAre(4));
  EXPECT_THAT(LayerTensorShape(c, "nope"), ElementsAre());

  const std::vector<ExpectedTensor> tensors = ExpectedLlamaTensors(c);
  ASSERT_EQ(tensors.size(), 1u + 2 * 9 + 2);
  EXPECT_EQ(tensors.front().name, kEmbedTokensName);
  EXPECT_THAT(tensors.front().shape, ElementsAre(10, 8));
  EXPECT_EQ(tensors[1].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(tensors.back().name, kLmHeadName);
}

TEST(LlamaWeightsTest, QwenStyleBiasesAndTiedEmbeddingsChangeTheList) {
  ModelConfig c = TinyConfig();
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  const std::vector<ExpectedTensor> tensors = ExpectedLlamaTensors(c);
  ASSERT_EQ(tensors.size(), 1u + 2 * 12 + 1);
  EXPECT_EQ(tensors.back().name, kFinalNormName);
  EXPECT_EQ(tensors[6].name, "model.layers.0.self_attn.q_proj.bias");
}

TEST(LlamaWeightsTest, AcceptsCompleteCheckpoint) {
  const ModelConfig c = TinyConfig();
  EXPECT_THAT(Validate(c, WriteModel(c)), IsOk());
}

TEST(LlamaWeightsTest, AcceptsQwenCheckpointWithBiasesAndTiedEmbeddings) {
  ModelConfig c = TinyConfig();
  c.model_type = "qwen2";
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  EXPECT_THAT(Validate(c, WriteModel(c)), IsOk());
}

TEST(LlamaWeightsTest, ToleratesInvFreqAndLmHeadWithTiedEmbeddings) {
  ModelConfig c = TinyConfig();
  c.tie_word_embeddings = true;
  EXPECT_THAT(Validate(c, WriteModel(c, {}, {},
                                     {{"model.layers.0.self_attn.rotary_emb.inv_freq", {2}},
                                      {kLmHeadName, {10, 8}}})),
              IsOk());
}

TEST(LlamaWeightsTest, MissingTensorIsFailedPrecondition) {
  const ModelConfig c = TinyConfig();
  const std::string dir = WriteModel(c, {"model.layers.1.self_attn.q_proj.weight"});
  EXPECT_THAT(Validate(c, dir),
              StatusIs(kUnsupported, AllOf(HasSubstr("\"model.layers.1.self_attn.q_proj.weight\""),
                                           HasSubstr("[8, 8]"), HasSubstr(dir))));
}

TEST(LlamaWeightsTest, MissingLmHeadWhenUntied) {
  const ModelConfig c = TinyConfig();
  EXPECT_THAT(Validate(c, WriteModel(c, {kLmHeadName})),
              StatusIs(kUnsupported, HasSubstr("\"lm_head.weight\"")));
}

TEST(LlamaWeightsTest, MissingQwenBias) {
  ModelConfig c = TinyConfig();
  c.attention_bias = true;
  EXPECT_THAT(Validate(c, WriteModel(c, {"model.layers.0.self_attn.k_proj.bias"})),
              StatusIs(kUnsupported, HasSubstr("\"model.layers.0.self_attn.k_proj.bias\"")));
}

TEST(LlamaWeightsTest, WrongShapeNamesExpectedActualAndFile) {
  const ModelConfig c = TinyConfig();
  const std::string dir = WriteModel(c, {}, {{"model.layers.0.self_attn.k_proj.weight", {8, 8}}});
  EXPECT_THAT(
      Validate(c, dir),
      StatusIs(kUnsupported, AllOf(HasSubstr("\"model.layers.0.self_attn.k_proj.weight\""),
                                   HasSubstr("has shape [8, 8]"), HasSubstr("implies [4, 8]"),
                                   HasSubstr(dir + "/model-0000"))));
}

TEST(LlamaWeightsTest, UnexpectedBiasIsFailedPrecondition) {
  const ModelConfig c = TinyConfig();
  EXPECT_THAT(Validate(c, WriteModel(c, {}, {}, {{"model.layers.0.self_attn.q_proj.bias", {8}}})),
              StatusIs(kUnsupported, AllOf(HasSubstr("\"model.layers.0.self_attn.q_proj.bias\""),
                                           HasSubstr("attention_bias false"))));
}

TEST(LlamaWeightsTest, ExtraLayerIsFailedPrecondition) {
  const ModelConfig c = TinyConfig();
  EXPECT_THAT(Validate(c, WriteModel(c, {}, {}, {{"model.layers.2.input_layernorm.weight", {8}}})),
              StatusIs(kUnsupported, AllOf(HasSubstr("model.layers.2."), HasSubstr("2 layers"))));
}

}  // namespace
}  // namespace trident::model
