#include "tools/make_model/tokenizer_gen/tokenizer_gen.h"

#include <cstdint>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace trident::make_model {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using tokenizer::Tokenizer;
using ::trident::testing::IsOk;
using ::trident::testing::IsOkAndHolds;
using ::trident::testing::StatusIs;

const std::vector<std::string>& RoundTripStrings() {
  static const auto* const strings = new std::vector<std::string>{
      "Hello, world!",
      "The quick brown fox jumps over the lazy dog.",
      "I'm sure you're right; they'll see.",
      "Numbers: 1 22 333 4444 55555 3.14159",
      "def f(x):\n    return x + 1\n",
      "  leading and trailing  ",
      "tabs\tand\nnewlines\r\n\r\nend",
      "Caf\xC3\xA9 cr\xC3\xA8me br\xC3\xBBl\xC3\xA9"
      "e",
      "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C",  // 你好，世界
      "\xF0\x9F\x98\x80 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xF0\x9F\x87\xBA\xF0\x9F\x87\xB8",
      "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4",  // 한국어
      "rare: \xE1\x9A\xA0\xE1\x9A\xA2 \xF0\x90\x8D\x88",
      "x",
      "",
  };
  return *strings;
}

struct Style {
  TokenizerStyle style;
  int32_t vocab_size;
};

class GeneratedTokenizerTest : public ::testing::TestWithParam<Style> {};

TEST_P(GeneratedTokenizerTest, LoadsAndRoundTrips) {
  const Style s = GetParam();
  absl::StatusOr<GeneratedTokenizer> gen = GenerateTokenizer(s.style, s.vocab_size);
  ASSERT_THAT(gen, IsOk());
  EXPECT_EQ(gen->vocab_size, s.vocab_size);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromJson(gen->tokenizer_json, gen->tokenizer_config_json, "generated");
  ASSERT_THAT(tok, IsOk());
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.vocab_size(), s.vocab_size);
  EXPECT_EQ(t.bos_token_id().value_or(-1), gen->bos_id);
  ASSERT_FALSE(gen->eos_ids.empty());
  EXPECT_THAT(t.eos_token_ids(), ElementsAre(gen->eos_ids[0]));
  for (int32_t id : gen->eos_ids) EXPECT_TRUE(t.IsSpecial(id)) << id;
  EXPECT_EQ(t.kind(), s.style == TokenizerStyle::kLlama2 ? Tokenizer::Kind::kSentencePieceBpe
                                                         : Tokenizer::Kind::kByteLevelBpe);
  for (const std::string& text : RoundTripStrings()) {
    const std::vector<int32_t> ids = t.Encode(text, /*add_special_tokens=*/true);
    if (gen->bos_id >= 0) {
      ASSERT_FALSE(ids.empty());
      EXPECT_EQ(ids[0], gen->bos_id);
    }
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, s.vocab_size);
    }
    // Exact for every style: Llama 2's decoder strips only the ▁ that the
    // Prepend normalizer added.
    EXPECT_THAT(t.Decode(ids, /*skip_special_tokens=*/true), IsOkAndHolds(text))
        << absl::CEscape(text);
  }
  // Learned merges actually compress common English.
  EXPECT_LT(t.Encode("the", false).size(), 3u);
}

// Every text of common/tokenizer/testdata/split_cases.json (the strings of
// tools/reference/tokenizer_strings.json and more): decode(encode(s)) == s,
// and streaming the ids one by one gives valid UTF-8 deltas that concatenate
// to the same text.
TEST_P(GeneratedTokenizerTest, ManyStringsRoundTripAndStream) {
  const Style s = GetParam();
  absl::StatusOr<GeneratedTokenizer> gen = GenerateTokenizer(s.style, s.vocab_size);
  ASSERT_THAT(gen, IsOk());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromJson(gen->tokenizer_json, gen->tokenizer_config_json, "generated");
  ASSERT_THAT(tok, IsOk());
  const Tokenizer& t = **tok;
  std::ifstream in("common/tokenizer/testdata/split_cases.json");
  ASSERT_TRUE(in.good());
  std::stringstream contents;
  contents << in.rdbuf();
  const nlohmann::json cases = nlohmann::json::parse(contents.str(), nullptr, false);
  ASSERT_TRUE(cases.is_array());
  std::set<std::string> texts;
  for (const nlohmann::json& c : cases) texts.insert(c["text"].get<std::string>());
  ASSERT_GT(texts.size(), 250u);
  for (const std::string& text : texts) {
    // Texts naming special tokens encode them as specials; skip those here.
    bool names_special = false;
    for (int32_t id = 0; id < t.vocab_size(); ++id) {
      if (t.IsSpecial(id) && text.find(t.IdToToken(id)) != std::string::npos) {
        names_special = true;
        break;
      }
    }
    const std::vector<int32_t> ids = t.Encode(text, /*add_special_tokens=*/false);
    if (!names_special) {
      // Qwen2's NFC normalizer makes the round trip exact for NFC text only.
      const std::string expected =
          s.style == TokenizerStyle::kQwen2 ? tokenizer::NfcNormalize(text) : text;
      EXPECT_THAT(t.Decode(ids, false), IsOkAndHolds(expected)) << absl::CEscape(text);
    }
    const std::vector<int32_t> with_bos = t.Encode(text, /*add_special_tokens=*/true);
    for (bool skip : {false, true}) {
      tokenizer::IncrementalDecoder stream(t, skip);
      std::string streamed;
      for (int32_t id : with_bos) {
        absl::StatusOr<std::string> delta = stream.Push(id);
        ASSERT_THAT(delta, IsOk());
        EXPECT_TRUE(tokenizer::IsValidUtf8(*delta));
        streamed += *delta;
      }
      streamed += stream.Finish();
      EXPECT_THAT(t.Decode(with_bos, skip), IsOkAndHolds(streamed)) << absl::CEscape(text);
    }
  }
}

TEST_P(GeneratedTokenizerTest, Deterministic) {
  const Style s = GetParam();
  absl::StatusOr<GeneratedTokenizer> a = GenerateTokenizer(s.style, s.vocab_size);
  absl::StatusOr<GeneratedTokenizer> b = GenerateTokenizer(s.style, s.vocab_size);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(a->tokenizer_json, b->tokenizer_json);
  EXPECT_EQ(a->tokenizer_config_json, b->tokenizer_config_json);
}

INSTANTIATE_TEST_SUITE_P(
    Styles, GeneratedTokenizerTest,
    ::testing::Values(Style{TokenizerStyle::kLlama3, 512}, Style{TokenizerStyle::kLlama3, 4096},
                      Style{TokenizerStyle::kQwen2, 1000}, Style{TokenizerStyle::kLlama2, 1024}),
    [](const ::testing::TestParamInfo<Style>& info) {
      return absl::StrCat(TokenizerStyleName(info.param.style), "_", info.param.vocab_size);
    });

TEST(GenerateTokenizerTest, HfSchema) {
  absl::StatusOr<GeneratedTokenizer> gen = GenerateTokenizer(TokenizerStyle::kLlama3, 600);
  ASSERT_THAT(gen, IsOk());
  const nlohmann::json j = nlohmann::json::parse(gen->tokenizer_json);
  EXPECT_EQ(j["version"], "1.0");
  EXPECT_TRUE(j["truncation"].is_null());
  EXPECT_TRUE(j["padding"].is_null());
  const nlohmann::json& model = j["model"];
  EXPECT_EQ(model["type"], "BPE");
  EXPECT_TRUE(model["ignore_merges"].get<bool>());
  EXPECT_FALSE(model["byte_fallback"].get<bool>());
  EXPECT_EQ(model["merges"][0], "\xC4\xA0 t");  // "Ġ t": the most frequent pair.
  const nlohmann::json config = nlohmann::json::parse(gen->tokenizer_config_json);
  EXPECT_EQ(config["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(config["bos_token"], "<|begin_of_text|>");

  absl::StatusOr<GeneratedTokenizer> llama2 = GenerateTokenizer(TokenizerStyle::kLlama2, 400);
  ASSERT_THAT(llama2, IsOk());
  const nlohmann::json l2 = nlohmann::json::parse(llama2->tokenizer_json);
  EXPECT_EQ(l2["model"]["vocab"]["<unk>"], 0);
  EXPECT_EQ(l2["model"]["vocab"]["<s>"], 1);
  EXPECT_EQ(l2["model"]["vocab"]["</s>"], 2);
  EXPECT_EQ(l2["model"]["vocab"]["<0x00>"], 3);
  EXPECT_EQ(l2["model"]["vocab"]["<0xFF>"], 258);
  EXPECT_EQ(l2["normalizer"]["normalizers"][0]["type"], "Prepend");
}

TEST(GenerateTokenizerTest, RejectsBadVocabSizes) {
  EXPECT_THAT(GenerateTokenizer(TokenizerStyle::kLlama3, 100),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("vocab_size 100")));
  EXPECT_THAT(GenerateTokenizer(TokenizerStyle::kLlama2, 1 << 21),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseTokenizerStyle("gpt2"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseTokenizerStyle("qwen2"), IsOkAndHolds(TokenizerStyle::kQwen2));
}

}  // namespace
}  // namespace trident::make_model
