#include "common/sampling/stop_checker.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::sampling {
namespace {

constexpr int32_t kEos = 2;
constexpr int32_t kText = 100;  // Any ordinary token.

StopParams WithStops(std::vector<std::string> stop_strings) {
  StopParams params;
  params.stop_strings = std::move(stop_strings);
  return params;
}

// Feeds `deltas` as ordinary tokens until the checker finishes; returns the
// concatenated emitted text and the last update.
std::pair<std::string, StopChecker::Update> Feed(StopChecker& checker,
                                                 const std::vector<std::string>& deltas) {
  std::string text;
  StopChecker::Update last;
  for (const std::string& delta : deltas) {
    last = checker.OnToken(kText, delta);
    text += last.text_to_emit;
    if (last.finished) break;
  }
  return {text, last};
}

TEST(StopCheckerTest, WithoutStopConditionsEmitsEverythingAtOnce) {
  StopChecker checker(StopParams(), {kEos});
  const StopChecker::Update update = checker.OnToken(kText, "Hello");
  EXPECT_EQ(update.text_to_emit, "Hello");
  EXPECT_FALSE(update.finished);
  EXPECT_EQ(update.reason, FinishReason::kNone);
  EXPECT_EQ(checker.OnToken(kText, " world").text_to_emit, " world");
  EXPECT_EQ(checker.num_tokens(), 2);
}

TEST(StopCheckerTest, StopStringSplitOverThreeTokens) {
  StopChecker checker(WithStops({"</s>"}), {kEos});
  StopChecker::Update u = checker.OnToken(kText, "Hi <");
  EXPECT_EQ(u.text_to_emit, "Hi ");
  u = checker.OnToken(kText, "/");
  EXPECT_EQ(u.text_to_emit, "");
  EXPECT_FALSE(u.finished);
  u = checker.OnToken(kText, "s");
  EXPECT_EQ(u.text_to_emit, "");
  u = checker.OnToken(kText, ">tail");
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.reason, FinishReason::kStopString);
  EXPECT_EQ(u.matched_stop, "</s>");
  EXPECT_EQ(u.text_to_emit, "");  // "tail" after the match is dropped.
  EXPECT_TRUE(checker.finished());
}

TEST(StopCheckerTest, HeldBackTextIsReleasedWhenItStopsMatching) {
  StopChecker checker(WithStops({"</s>"}), {kEos});
  EXPECT_EQ(checker.OnToken(kText, "a </").text_to_emit, "a ");
  EXPECT_EQ(checker.OnToken(kText, "b").text_to_emit, "</b");
}

TEST(StopCheckerTest, IncludesTheStopStringWhenAsked) {
  StopParams params = WithStops({"STOP"});
  params.include_stop_string_in_output = true;
  StopChecker checker(params, {kEos});
  const auto [text, last] = Feed(checker, {"go ", "ST", "OP and more"});
  EXPECT_EQ(text, "go STOP");
  EXPECT_EQ(last.reason, FinishReason::kStopString);
}

TEST(StopCheckerTest, StopStringInTheFirstToken) {
  StopChecker checker(WithStops({"###"}), {kEos});
  const StopChecker::Update u = checker.OnToken(kText, "###xyz");
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.text_to_emit, "");
  EXPECT_EQ(u.matched_stop, "###");
}

TEST(StopCheckerTest, TextBeforeAMatchInOneDeltaIsEmitted) {
  StopChecker checker(WithStops({"\n\n"}), {kEos});
  const StopChecker::Update u = checker.OnToken(kText, "line\n\nnext");
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.text_to_emit, "line");
}

TEST(StopCheckerTest, OverlappingCandidatesShortestCompleteMatchWins) {
  // "ab" completes before "abc" could.
  StopChecker checker(WithStops({"ab", "abc", "bcd"}), {kEos});
  const auto [text, last] = Feed(checker, {"xa", "bcd"});
  EXPECT_EQ(text, "x");
  EXPECT_EQ(last.matched_stop, "ab");
}

TEST(StopCheckerTest, OverlappingCandidatesHoldBackTheLongestPrefix) {
  StopChecker checker(WithStops({"abc", "bcd"}), {kEos});
  // "ab" is a prefix of "abc" (and "b" of "bcd"): hold back two bytes.
  EXPECT_EQ(checker.OnToken(kText, "xab").text_to_emit, "x");
  // "abx" contains neither; "x" starts nothing.
  EXPECT_EQ(checker.OnToken(kText, "x").text_to_emit, "abx");
}

TEST(StopCheckerTest, OverlappingCandidatesMatchAcrossTheHeldBackText) {
  StopChecker checker(WithStops({"abc", "bcd"}), {kEos});
  const auto [text, last] = Feed(checker, {"zab", "cd"});
  EXPECT_EQ(text, "z");
  EXPECT_EQ(last.matched_stop, "abc");  // Ends at "c", before "bcd" ends.

  StopChecker second(WithStops({"abc", "bcd"}), {kEos});
  const auto [text2, last2] = Feed(second, {"zb", "cd"});
  EXPECT_EQ(text2, "z");
  EXPECT_EQ(last2.matched_stop, "bcd");
}

TEST(StopCheckerTest, EarliestEndingMatchWinsWithinOneDelta) {
  StopChecker checker(WithStops({"abcd", "bc"}), {kEos});
  const StopChecker::Update u = checker.OnToken(kText, "xabcd");
  EXPECT_EQ(u.matched_stop, "bc");
  EXPECT_EQ(u.text_to_emit, "xa");
}

TEST(StopCheckerTest, LongestWinsAmongMatchesEndingTogether) {
  StopChecker checker(WithStops({"bc", "abc"}), {kEos});
  const StopChecker::Update u = checker.OnToken(kText, "xabc");
  EXPECT_EQ(u.matched_stop, "abc");
  EXPECT_EQ(u.text_to_emit, "x");
}

TEST(StopCheckerTest, MultibyteStopStringAcrossTokens) {
  StopChecker checker(WithStops({"日本"}), {kEos});
  EXPECT_EQ(checker.OnToken(kText, "今日").text_to_emit, "今");
  const StopChecker::Update u = checker.OnToken(kText, "本語");
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.text_to_emit, "");
  EXPECT_EQ(u.matched_stop, "日本");
}

TEST(StopCheckerTest, MultibyteHeldBackCharacterIsReleasedWhole) {
  StopChecker checker(WithStops({"éa"}), {kEos});
  EXPECT_EQ(checker.OnToken(kText, "café").text_to_emit, "caf");
  EXPECT_EQ(checker.OnToken(kText, "ñ").text_to_emit, "éñ");
}

TEST(StopCheckerTest, NeverSplitsACharacterEvenForAnInvalidStopString) {
  // "\xA9" is the second byte of "é" (C3 A9): a stop string that is not
  // UTF-8 on its own. The held-back cut moves back to the character start.
  StopChecker checker(WithStops({"\xA9z"}), {kEos});
  EXPECT_EQ(checker.OnToken(kText, "café").text_to_emit, "caf");
  EXPECT_EQ(checker.Finish().text_to_emit, "é");
}

TEST(StopCheckerTest, EosFinishesWithoutItsTextAndFlushesHeldBackText) {
  StopChecker checker(WithStops({"</s>"}), {kEos});
  EXPECT_EQ(checker.OnToken(kText, "end <").text_to_emit, "end ");
  const StopChecker::Update u = checker.OnToken(kEos, "<eos>");
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.reason, FinishReason::kStopToken);
  EXPECT_EQ(u.matched_stop_token_id, kEos);
  EXPECT_FALSE(u.matched_stop.has_value());
  EXPECT_EQ(u.text_to_emit, "<");
}

TEST(StopCheckerTest, IgnoreEosKeepsGoingButStopTokenIdsStillStop) {
  StopParams params;
  params.ignore_eos = true;
  params.stop_token_ids = {7};
  StopChecker checker(params, {kEos, 3});
  StopChecker::Update u = checker.OnToken(kEos, "");
  EXPECT_FALSE(u.finished);
  u = checker.OnToken(3, "x");
  EXPECT_FALSE(u.finished);
  EXPECT_EQ(u.text_to_emit, "x");
  u = checker.OnToken(7, "seven");
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.reason, FinishReason::kStopToken);
  EXPECT_EQ(u.matched_stop_token_id, 7);
  EXPECT_EQ(u.text_to_emit, "");
}

TEST(StopCheckerTest, MaxTokensFinishesWithLengthAfterTheTokensText) {
  StopParams params = WithStops({"</s>"});
  params.max_tokens = 2;
  StopChecker checker(params, {kEos});
  EXPECT_FALSE(checker.OnToken(kText, "a").finished);
  const StopChecker::Update u = checker.OnToken(kText, "b</");
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.reason, FinishReason::kLength);
  EXPECT_EQ(u.text_to_emit, "b</");  // Held-back text is flushed too.
}

TEST(StopCheckerTest, StopStringOnTheLastAllowedTokenIsAStop) {
  StopParams params = WithStops({"!"});
  params.max_tokens = 1;
  StopChecker checker(params, {kEos});
  const StopChecker::Update u = checker.OnToken(kText, "hi!");
  EXPECT_EQ(u.reason, FinishReason::kStopString);
  EXPECT_EQ(u.text_to_emit, "hi");
}

TEST(StopCheckerTest, EosOnTheLastAllowedTokenIsAStop) {
  StopParams params;
  params.max_tokens = 1;
  StopChecker checker(params, {kEos});
  EXPECT_EQ(checker.OnToken(kEos, "").reason, FinishReason::kStopToken);
}

TEST(StopCheckerTest, FinishFlushesHeldBackTextOnce) {
  StopChecker checker(WithStops({"STOP"}), {kEos});
  EXPECT_EQ(checker.OnToken(kText, "abc ST").text_to_emit, "abc ");
  StopChecker::Update u = checker.Finish();
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.reason, FinishReason::kNone);
  EXPECT_EQ(u.text_to_emit, "ST");
  EXPECT_EQ(checker.Finish().text_to_emit, "");
}

TEST(StopCheckerTest, CallsAfterFinishingReturnNothingAndKeepTheReason) {
  StopChecker checker(WithStops({"x"}), {kEos});
  ASSERT_TRUE(checker.OnToken(kText, "axb").finished);
  StopChecker::Update u = checker.OnToken(kText, "more");
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.reason, FinishReason::kStopString);
  EXPECT_EQ(u.text_to_emit, "");
  EXPECT_EQ(checker.Finish().reason, FinishReason::kStopString);
  EXPECT_EQ(checker.num_tokens(), 1);
}

TEST(StopCheckerTest, EmptyStopStringsAreIgnored) {
  StopChecker checker(WithStops({""}), {kEos});
  const StopChecker::Update u = checker.OnToken(kText, "abc");
  EXPECT_FALSE(u.finished);
  EXPECT_EQ(u.text_to_emit, "abc");
}

TEST(StopCheckerTest, OutputIsIndependentOfTokenization) {
  // The same text split every possible way into two or three tokens gives
  // the same emitted text and match.
  const std::string text = "say aab then bcd";
  const StopParams params = WithStops({"aab", "abx", "bc"});
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j = i; j <= text.size(); ++j) {
      StopChecker checker(params, {kEos});
      const auto [emitted, last] =
          Feed(checker, {text.substr(0, i), text.substr(i, j - i), text.substr(j)});
      EXPECT_EQ(emitted, "say ") << i << "," << j;
      EXPECT_EQ(last.matched_stop, "aab") << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace trident::sampling
