#include "common/tokenizer/split_pattern.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace trident::tokenizer {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Split(SplitPattern pattern, absl::string_view text) {
  std::vector<std::string> out;
  for (absl::string_view piece : SplitIsolated(pattern, text)) out.emplace_back(piece);
  return out;
}

TEST(SplitPatternTest, RecognizesExactlyTheThreeRegexes) {
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kLlama3, SplitPattern::kQwen2}) {
    EXPECT_EQ(SplitPatternFromRegex(SplitPatternRegex(p)), p);
  }
  EXPECT_EQ(SplitPatternFromRegex("\\s+"), absl::nullopt);
  std::string almost(SplitPatternRegex(SplitPattern::kGpt2));
  almost.pop_back();
  EXPECT_EQ(SplitPatternFromRegex(almost), absl::nullopt);
}

TEST(SplitPatternTest, Gpt2Contractions) {
  EXPECT_THAT(Split(SplitPattern::kGpt2, "I'm we'll they'd"),
              ElementsAre("I", "'m", " we", "'ll", " they", "'d"));
  // Case-sensitive: 'M is not a contraction for GPT-2.
  EXPECT_THAT(Split(SplitPattern::kGpt2, "I'M"), ElementsAre("I", "'", "M"));
}

TEST(SplitPatternTest, Llama3ContractionsIgnoreCase) {
  EXPECT_THAT(Split(SplitPattern::kLlama3, "I'M you'Re"), ElementsAre("I", "'M", " you", "'Re"));
  // U+017F LONG S folds to 's'.
  EXPECT_THAT(Split(SplitPattern::kLlama3, "x'\xC5\xBF"), ElementsAre("x", "'\xC5\xBF"));
}

TEST(SplitPatternTest, NumbersGroupByPattern) {
  EXPECT_THAT(Split(SplitPattern::kGpt2, "a 1234567"), ElementsAre("a", " 1234567"));
  EXPECT_THAT(Split(SplitPattern::kLlama3, "a 1234567"), ElementsAre("a", " ", "123", "456", "7"));
  EXPECT_THAT(Split(SplitPattern::kQwen2, "a 123"), ElementsAre("a", " ", "1", "2", "3"));
}

TEST(SplitPatternTest, WhitespaceRunsLeaveOneSpaceForTheNextWord) {
  EXPECT_THAT(Split(SplitPattern::kGpt2, "a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(Split(SplitPattern::kGpt2, "a   "), ElementsAre("a", "   "));
  EXPECT_THAT(Split(SplitPattern::kGpt2, "a \tb"), ElementsAre("a", " ", "\t", "b"));
  EXPECT_THAT(Split(SplitPattern::kLlama3, "a   b"), ElementsAre("a", "  ", " b"));
}

TEST(SplitPatternTest, Llama3Newlines) {
  EXPECT_THAT(Split(SplitPattern::kLlama3, "a\n\nb"), ElementsAre("a", "\n\n", "b"));
  EXPECT_THAT(Split(SplitPattern::kLlama3, "a.\n\nb"), ElementsAre("a", ".\n\n", "b"));
  EXPECT_THAT(Split(SplitPattern::kLlama3, "  \n\n  x"), ElementsAre("  \n\n", " ", " x"));
  // (?!\S) gives one newline back; the second is a run of its own.
  EXPECT_THAT(Split(SplitPattern::kGpt2, "a\n\nb"), ElementsAre("a", "\n", "\n", "b"));
}

TEST(SplitPatternTest, Llama3PunctuationPrefixesWords) {
  EXPECT_THAT(Split(SplitPattern::kLlama3, "(hello) $world"),
              ElementsAre("(hello", ")", " $", "world"));
  EXPECT_THAT(Split(SplitPattern::kGpt2, "(hello) $world"),
              ElementsAre("(", "hello", ")", " $", "world"));
}

TEST(SplitPatternTest, CjkEmojiAndMarks) {
  // 中文 are letters; the emoji is "other"; U+0301 is a mark (neither L nor N).
  EXPECT_THAT(Split(SplitPattern::kGpt2, "\xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80!"),
              ElementsAre("\xE4\xB8\xAD\xE6\x96\x87", " \xF0\x9F\x98\x80!"));
  EXPECT_THAT(Split(SplitPattern::kGpt2, "cafe\xCC\x81s"), ElementsAre("cafe", "\xCC\x81", "s"));
  EXPECT_THAT(Split(SplitPattern::kLlama3, "cafe\xCC\x81s"), ElementsAre("cafe", "\xCC\x81s"));
}

TEST(SplitPatternTest, EmptyInput) {
  EXPECT_TRUE(SplitIsolated(SplitPattern::kGpt2, "").empty());
  EXPECT_TRUE(SplitIsolated(SplitPattern::kLlama3, "").empty());
}

// testdata/split_cases.json: the Python `regex` module's matches for ~300
// strings (gen_split_testdata.py).
TEST(SplitPatternTest, MatchesPythonRegexModule) {
  std::ifstream in("common/tokenizer/testdata/split_cases.json");
  ASSERT_TRUE(in.good());
  std::stringstream contents;
  contents << in.rdbuf();
  const nlohmann::json cases = nlohmann::json::parse(contents.str(), nullptr, false);
  ASSERT_TRUE(cases.is_array());
  int checked = 0;
  for (const nlohmann::json& c : cases) {
    const std::string name = c["pattern"].get<std::string>();
    const SplitPattern pattern = name == "gpt2"     ? SplitPattern::kGpt2
                                 : name == "llama3" ? SplitPattern::kLlama3
                                                    : SplitPattern::kQwen2;
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(Split(pattern, text), c["pieces"].get<std::vector<std::string>>())
        << name << " \"" << absl::CEscape(text) << "\"";
    ++checked;
  }
  EXPECT_GT(checked, 600);
}

}  // namespace
}  // namespace trident::tokenizer
