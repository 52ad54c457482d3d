#include "common/engine/engine.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/backend/fake_model_backend.h"
#include "common/engine/engine_testing.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::engine {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

// Collects one request's events; Done() is notified by the final one.
struct Collector {
  absl::Mutex mu;
  std::vector<TokenEvent> events;
  absl::Notification done;

  TokenCallback Callback() {
    return [this](const TokenEvent& ev) {
      {
        absl::MutexLock lock(&mu);
        events.push_back(ev);
      }
      if (ev.finish != FinishReason::kNone) done.Notify();
    };
  }
  FinishReason finish() {
    absl::MutexLock lock(&mu);
    return events.back().finish;
  }
  size_t size() {
    absl::MutexLock lock(&mu);
    return events.size();
  }
};

std::unique_ptr<backend::FakeModelBackend> Fake() {
  return std::make_unique<backend::FakeModelBackend>(50, 32, 4, 128);
}

TEST(EngineTest, ServesConcurrentRequestsToCompletion) {
  Engine engine(Fake(), {});
  Collector a, b;
  ASSERT_THAT(engine.Submit(Greedy("a", {1, 2, 3}, 7), a.Callback()), IsOk());
  ASSERT_THAT(engine.Submit(Greedy("b", {4, 5}, 3), b.Callback()), IsOk());
  a.done.WaitForNotification();
  b.done.WaitForNotification();
  EXPECT_EQ(a.size(), 7u);
  EXPECT_EQ(b.size(), 3u);
  EXPECT_EQ(a.finish(), FinishReason::kLength);
  engine.Shutdown();
  EXPECT_EQ(engine.stats().blocks_free, 32);
}

// The prefill rate the router prices prompts with counts only steps that
// computed enough prompt tokens to tell it: a few tokens (a cached prefix's
// remainder) are all fixed cost.
TEST(EngineTest, ThePrefillRateIgnoresStepsOfAFewPromptTokens) {
  Engine engine(Fake(), {});
  Collector few;
  ASSERT_THAT(engine.Submit(Greedy("few", {1, 2, 3, 4}, 1), few.Callback()), IsOk());
  few.done.WaitForNotification();
  EXPECT_EQ(engine.stats().prefill_tokens_per_second, 0);
  std::vector<int32_t> prompt(kMinRatePrefillTokens);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i % 50);
  Collector many;
  ASSERT_THAT(engine.Submit(Greedy("many", prompt, 1), many.Callback()), IsOk());
  many.done.WaitForNotification();
  EXPECT_GT(engine.stats().prefill_tokens_per_second, 0);
  engine.Shutdown();
}

// The KV tier's write-through: the loop holds each block the prefix cache
// names, up to the bound, until the taker frees it; the rest are counted.
TEST(EngineTest, HeldPublishedBlocksWaitForTheirTakerAndTheBoundCounts) {
  Engine engine(Fake(), {});
  engine.HoldPublishedBlocks(2);
  Collector c;
  // 13 prompt tokens and 4 outputs: the KV of 16 tokens, 4 full blocks.
  ASSERT_THAT(engine.Submit(Greedy("a", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, 4),
                            c.Callback()),
              IsOk());
  c.done.WaitForNotification();
  // Held before the step that made the last token delivered it.
  EXPECT_EQ(engine.stats().blocks_free, 30);
  const std::vector<std::pair<kv::BlockKey, int32_t>> held = engine.TakeHeldBlocks();
  ASSERT_EQ(held.size(), 2u);
  EXPECT_NE(held[0].first, held[1].first);
  EXPECT_NE(held[0].second, held[1].second);
  EXPECT_EQ(engine.held_blocks_dropped(), 2);
  EXPECT_TRUE(engine.TakeHeldBlocks().empty());
  std::vector<int32_t> blocks = {held[0].second, held[1].second};
  ASSERT_THAT(engine.FreeBlocks(blocks), IsOk());
  engine.Shutdown();
  EXPECT_EQ(engine.stats().blocks_free, 32);
}

// Disaggregated hand-over through two engine threads: a prefill-only request
// on one engine, its blocks' KV copied into blocks reserved on the other,
// decoded there; the tokens equal one engine's, and every block of both ends
// free once the prefill side releases its hand-over.
TEST(EngineTest, PrefillOnOneEngineDecodeOnAnother) {
  const EngineRequest request = Greedy("r", {3, 1, 4, 1, 5, 9, 2, 6, 5}, 8);
  std::vector<int32_t> expected;
  {
    Engine single(Fake(), {});
    Collector c;
    ASSERT_THAT(single.Submit(request, c.Callback()), IsOk());
    c.done.WaitForNotification();
    for (const TokenEvent& ev : c.events) expected.push_back(ev.token);
  }
  auto prefill_fake = Fake();
  auto decode_fake = Fake();
  backend::FakeModelBackend* prefill_kv = prefill_fake.get();
  backend::FakeModelBackend* decode_kv = decode_fake.get();
  Engine prefill(std::move(prefill_fake), {});
  Engine decode(std::move(decode_fake), {});
  Collector first;
  EngineRequest prefill_request = request;
  prefill_request.prefill_only = true;
  ASSERT_THAT(prefill.Submit(prefill_request, first.Callback()), IsOk());
  first.done.WaitForNotification();
  ASSERT_EQ(first.size(), 1u);
  const TokenEvent handed = first.events[0];
  ASSERT_EQ(handed.finish, FinishReason::kPrefilled);
  ASSERT_EQ(handed.prefilled_blocks.size(), 3u);  // 9 tokens in blocks of 4

  auto reserved = decode.ReserveBlocks(3);
  ASSERT_THAT(reserved.status(), IsOk());
  EXPECT_THAT(decode.ReserveBlocks(1000), StatusIs(absl::StatusCode::kResourceExhausted));
  decode_kv->CopyKvBlocks(*prefill_kv, handed.prefilled_blocks, *reserved);
  EXPECT_THAT(decode.SubmitPrefilled(request, {(*reserved)[0]}, handed.token, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  Collector rest;
  ASSERT_THAT(decode.SubmitPrefilled(request, *reserved, handed.token, rest.Callback()), IsOk());
  prefill.ReleasePrefilled("r");
  rest.done.WaitForNotification();
  std::vector<int32_t> got = {handed.token};
  for (const TokenEvent& ev : rest.events) got.push_back(ev.token);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(rest.finish(), FinishReason::kLength);
  prefill.Shutdown();
  decode.Shutdown();
  EXPECT_EQ(prefill.stats().blocks_free, 32);
  EXPECT_EQ(decode.stats().blocks_free, 32);
}

TEST(EngineTest, SubmitValidatesSynchronously) {
  Engine engine(Fake(), {});
  Collector c;
  EXPECT_THAT(engine.Submit(Greedy("x", {}, 3), c.Callback()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(c.size(), 0u);
}

// Holds the engine's loop before its second step until released.
class HoldSecondStep final : public StepHook {
 public:
  explicit HoldSecondStep(absl::Notification* release) : release_(release) {}
  void BeforeStep(EngineCore& core) override {
    (void)core;
    if (++steps_ == 2) release_->WaitForNotification();
  }
  void OnRemoteReleased(const std::string& id, const backend::RemoteKv& remote) override {
    (void)id;
    (void)remote;
  }

 private:
  absl::Notification* release_;
  int steps_ = 0;
};

TEST(EngineTest, AbortDeliversAFinalAbortedEventAndFreesBlocks) {
  Engine engine(Fake(), {});
  Collector c;
  // The loop waits before its second step until Abort has been called, so
  // the abort is applied before that step or right after it, whatever the
  // timing: the stream is output 0 (and 1), then the aborted event.
  absl::Notification first_token, abort_sent;
  HoldSecondStep hold(&abort_sent);
  engine.SetStepHook(&hold);
  ASSERT_THAT(engine.Submit(Greedy("long", {1, 2, 3}, 120),
                            [&](const TokenEvent& ev) {
                              c.Callback()(ev);
                              if (ev.output_index == 0 && ev.finish == FinishReason::kNone) {
                                first_token.Notify();
                              }
                            }),
              IsOk());
  first_token.WaitForNotification();
  engine.Abort("long");
  abort_sent.Notify();
  c.done.WaitForNotification();
  EXPECT_EQ(c.finish(), FinishReason::kAborted);
  EXPECT_THAT(c.size(), ::testing::AnyOf(2u, 3u));
  engine.Shutdown();
  EXPECT_EQ(engine.stats().blocks_free, 32);
  EXPECT_EQ(engine.stats().running, 0);
}

// Callbacks run off the loop thread: one that blocks holds up only the
// delivery, and the loop steps on (here to the request's end).
TEST(EngineTest, ABlockedCallbackDoesNotHoldUpTheSteps) {
  Engine engine(Fake(), {});
  absl::Notification release, first_called;
  std::atomic<int> delivered{0};
  absl::Notification done;
  ASSERT_THAT(engine.Submit(Greedy("held", {1, 2, 3}, 40),
                            [&](const TokenEvent& ev) {
                              if (delivered.fetch_add(1) == 0) {
                                first_called.Notify();
                                release.WaitForNotification();
                              }
                              if (ev.finish != FinishReason::kNone) done.Notify();
                            }),
              IsOk());
  // The engine finishes the request while its first callback is blocked.
  absl::Notification finished;
  engine.SetStatsObserver([&](const EngineStats& s) {
    if (s.running == 0 && s.waiting == 0 && s.last_step_decode_sequences > 0 &&
        !finished.HasBeenNotified()) {
      finished.Notify();
    }
  });
  finished.WaitForNotification();
  first_called.WaitForNotification();
  EXPECT_EQ(delivered.load(), 1);
  release.Notify();
  done.WaitForNotification();
  EXPECT_EQ(delivered.load(), 40);
  // One batch a step; the ones behind the held callback waited for it.
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.delivered_batches_total, 40);
  EXPECT_GT(stats.delivery_lag_seconds_total, 0);
}

TEST(EngineTest, ShutdownAbortsLiveRequestsAndRefusesNewOnes) {
  Engine engine(Fake(), {});
  Collector c;
  ASSERT_THAT(engine.Submit(Greedy("live", {1}, 120), c.Callback()), IsOk());
  engine.Shutdown();
  ASSERT_TRUE(c.done.HasBeenNotified());
  // Either it finished by length before the shutdown or was aborted.
  EXPECT_TRUE(c.finish() == FinishReason::kAborted || c.finish() == FinishReason::kLength);
  Collector d;
  EXPECT_THAT(engine.Submit(Greedy("late", {1}, 1), d.Callback()),
              StatusIs(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace trident::engine

namespace trident::engine {
namespace {

TEST(EngineShortOfBlocksTest, ARequestWaitingForReservedBlocksRunsOnceTheyAreFreed) {
  Engine engine(Fake(), {});                 // 32 blocks of 4 tokens.
  auto reserved = engine.ReserveBlocks(31);  // Held for other workers' prompts.
  ASSERT_THAT(reserved.status(), IsOk());
  absl::Notification short_of_blocks;
  engine.SetStatsObserver([&short_of_blocks](const EngineStats& stats) {
    if (stats.short_of_blocks && !short_of_blocks.HasBeenNotified()) short_of_blocks.Notify();
  });
  Collector c;
  ASSERT_THAT(engine.Submit(Greedy("r", {1, 2, 3, 4, 5, 6, 7, 8}, 4), c.Callback()), IsOk());
  short_of_blocks.WaitForNotification();  // 2 blocks wanted, 1 free: it waits.
  EXPECT_FALSE(c.done.HasBeenNotified());

  // Nothing else arrives: freeing the reservation alone wakes the engine.
  ASSERT_THAT(engine.FreeBlocks(*reserved), IsOk());
  c.done.WaitForNotification();
  EXPECT_EQ(c.finish(), FinishReason::kLength);
  EXPECT_EQ(c.size(), 4u);
}

}  // namespace
}  // namespace trident::engine
