#include "bench/kvbench/workload.h"

#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::kvbench {
namespace {

using testing::IsOk;
using testing::StatusIs;

TEST(WorkloadTest, ChatSessionsShareTheirSystemPromptAndAreReproducible) {
  ChatSpec spec;
  spec.sessions = 20;
  spec.system_prompts = 2;
  spec.system_tokens = 64;
  absl::StatusOr<std::vector<Session>> a = MakeChatSessions(spec, Vocabulary{});
  absl::StatusOr<std::vector<Session>> b = MakeChatSessions(spec, Vocabulary{});
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  int with_first = 0;
  for (size_t i = 0; i < a->size(); ++i) {
    const Session& s = (*a)[i];
    EXPECT_TRUE(s.chat);
    EXPECT_GE(s.turns.size(), 3u);
    EXPECT_LE(s.turns.size(), 6u);
    EXPECT_EQ(s.turns[0].tokens, (*b)[i].turns[0].tokens);
    if (i > 0) {
      EXPECT_GE(s.start, (*a)[i - 1].start);
    }
    const std::vector<int32_t> system(s.turns[0].tokens.begin(), s.turns[0].tokens.begin() + 64);
    const std::vector<int32_t> first((*a)[0].turns[0].tokens.begin(),
                                     (*a)[0].turns[0].tokens.begin() + 64);
    if (system == first) ++with_first;
    for (const Turn& t : s.turns) {
      for (int32_t id : t.tokens) {
        ASSERT_GE(id, 16);
        ASSERT_LT(id, 32000);
      }
    }
  }
  // Two system prompts: some sessions share the first one, not all.
  EXPECT_GT(with_first, 1);
  EXPECT_LT(with_first, 20);
}

TEST(WorkloadTest, TracePromptsExtendTheirSessionsEarlierPrompts) {
  TraceSpec spec;
  spec.sessions = 300;
  absl::StatusOr<std::vector<Session>> sessions = MakeTraceSessions(spec, Vocabulary{});
  ASSERT_THAT(sessions, IsOk());
  std::vector<std::vector<int32_t>> prompts;
  int multi = 0;
  for (const Session& s : *sessions) {
    ASSERT_FALSE(s.turns.empty());
    if (s.turns.size() > 1) ++multi;
    for (size_t t = 0; t < s.turns.size(); ++t) {
      const std::vector<int32_t>& prompt = s.turns[t].tokens;
      EXPECT_LE(prompt.size(), static_cast<size_t>(spec.max_prompt_tokens));
      // Every prompt starts with the shared head block.
      EXPECT_TRUE(std::equal(prompt.begin(), prompt.begin() + spec.block_tokens,
                             (*sessions)[0].turns[0].tokens.begin()));
      if (t > 0) {
        const std::vector<int32_t>& before = s.turns[t - 1].tokens;
        const size_t whole = before.size() / spec.block_tokens * spec.block_tokens;
        EXPECT_TRUE(std::equal(before.begin(), before.begin() + whole, prompt.begin()));
        EXPECT_GE(s.turns[t].delay, s.turns[t - 1].delay);
      }
      prompts.push_back(prompt);
    }
  }
  EXPECT_GT(multi, 60);
  EXPECT_LT(multi, 240);
  // The shape of the conversation trace: about 37% of prompt tokens reusable.
  const double ideal = IdealHitRate(prompts, 16);
  EXPECT_GT(ideal, 0.25);
  EXPECT_LT(ideal, 0.5);
}

TEST(WorkloadTest, IdealHitRateCountsWholeBlocksOfPrefixesSeenBefore) {
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<int32_t> b = {1, 2, 3, 4, 5, 6, 9, 9, 9};
  const std::vector<int32_t> c = {1, 2, 3, 4};  // At most 3 tokens: no whole block of 4.
  // b reuses a's first block (4 tokens) only; c nothing.
  EXPECT_DOUBLE_EQ(IdealHitRate({a, b, c}, 4), 4.0 / 22.0);
  EXPECT_DOUBLE_EQ(IdealHitRate({a, a}, 4), 8.0 / 18.0);
  // What the server generated after a counts too: a + answer covers b.
  const std::vector<int32_t> answered = {1, 2, 3, 4, 5, 6, 9, 9, 9};
  EXPECT_DOUBLE_EQ(IdealHitRate({a, b}, 4, {answered, b}), 8.0 / 18.0);
}

TEST(WorkloadTest, BadSpecsAreRefused) {
  ChatSpec chat;
  chat.session_rate = 0;
  EXPECT_THAT(MakeChatSessions(chat, Vocabulary{}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  TraceSpec trace;
  trace.max_prompt_tokens = 100;
  EXPECT_THAT(MakeTraceSessions(trace, Vocabulary{}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(MakeChatSessions(ChatSpec{}, Vocabulary{.vocab_size = 10, .first_id = 16}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace trident::kvbench
