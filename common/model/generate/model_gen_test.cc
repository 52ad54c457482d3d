#include "common/model/generate/model_gen.h"

#include <fstream>
#include <iterator>
#include <string>

#include "common/model/checkpoint.h"
#include "common/model/config.h"
#include "common/model/generate/tokenizer_gen.h"
#include "common/model/llama_weights.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::model::generate {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;
using ::trident::testing::TestTmpPath;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class ModelGenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ModelGenTest, WritesALoadableDeterministicModel) {
  auto spec = PresetSpec(GetParam());
  ASSERT_THAT(spec.status(), IsOk());
  const std::string a = TestTmpPath(GetParam() + "-a");
  const std::string b = TestTmpPath(GetParam() + "-b");
  ASSERT_THAT(WriteModel(*spec, a), IsOk());
  ASSERT_THAT(WriteModel(*spec, b), IsOk());
  for (const char* file : {"config.json", "generation_config.json", "model.safetensors",
                           "tokenizer.json", "tokenizer_config.json"}) {
    const std::string bytes = ReadFile(a + "/" + file);
    EXPECT_FALSE(bytes.empty()) << file;
    EXPECT_EQ(bytes, ReadFile(b + "/" + file)) << file << " differs between two runs";
  }
  auto config = model::LoadModelConfig(a);
  ASSERT_THAT(config.status(), IsOk());
  EXPECT_EQ(config->hidden_size, spec->hidden_size);
  EXPECT_EQ(config->num_key_value_heads, spec->num_kv_heads);
  auto ckpt = model::Checkpoint::Open(a);
  ASSERT_THAT(ckpt.status(), IsOk());
  EXPECT_THAT(model::ValidateLlamaCheckpoint(*config, **ckpt), IsOk());

  auto tok = tokenizer::Tokenizer::FromDirectory(a);
  ASSERT_THAT(tok.status(), IsOk());
  EXPECT_LE((*tok)->vocab_size(), config->vocab_size);
  const std::string corpus = TrainingCorpus();
  const auto ids = (*tok)->Encode(corpus, /*add_special_tokens=*/false);
  // Merges were learned on this text, so it compresses well below one token
  // per byte.
  EXPECT_LT(ids.size(), corpus.size() / 2);
  EXPECT_THAT((*tok)->Decode(ids, /*skip_special_tokens=*/false),
              ::trident::testing::IsOkAndHolds(corpus));
  ASSERT_FALSE(config->eos_token_ids.empty());
  for (int32_t eos : config->eos_token_ids) EXPECT_TRUE((*tok)->IsSpecial(eos));
}

INSTANTIATE_TEST_SUITE_P(Presets, ModelGenTest,
                         ::testing::Values("llama3-tiny", "qwen2-tiny", "mistral-tiny"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

TEST(ModelGenTest, UnknownPresetAndBadSizes) {
  EXPECT_THAT(PresetSpec("gpt-5").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("llama3-tiny")));
  ModelSpec spec;
  spec.num_heads = 3;
  spec.num_kv_heads = 2;
  EXPECT_THAT(WriteModel(spec, TestTmpPath("bad")), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(GenerateTokenizer(TokenizerStyle::kLlama3, 100).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace trident::model::generate
