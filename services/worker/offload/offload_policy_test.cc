#include "services/worker/offload/offload_policy.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

engine::OffloadCandidate Candidate(const std::string& id, int32_t tokens) {
  return engine::OffloadCandidate{.id = id,
                                  .blocks = std::vector<int32_t>((tokens + 15) / 16, 0),
                                  .num_computed = tokens,
                                  .max_len = tokens + 100};
}

TEST(OffloadPolicyTest, LongContextsGoLongestFirstUpToTheStepsMoves) {
  const std::vector<engine::OffloadCandidate> c = {Candidate("a", 100), Candidate("b", 5000),
                                                   Candidate("c", 3000), Candidate("d", 2048),
                                                   Candidate("e", 4000)};
  EXPECT_THAT(ChooseOffloads(c, {100, 1000}, {.min_context_tokens = 2048, .max_moves = 3}),
              ElementsAre("b", "e", "c"));
  EXPECT_THAT(ChooseOffloads(c, {100, 1000}, {.min_context_tokens = 2048, .max_moves = 8}),
              ElementsAre("b", "e", "c", "d"));
}

TEST(OffloadPolicyTest, NothingMovesWithBothRulesOff) {
  const std::vector<engine::OffloadCandidate> c = {Candidate("a", 100000)};
  EXPECT_THAT(ChooseOffloads(c, {0, 1000}, {}), IsEmpty());
}

TEST(OffloadPolicyTest, PoolPressureMovesTheLongestUntilTheWatermarkHolds) {
  // 1000 blocks, 20 free: below 5%. Moving "b" (313 blocks) restores it.
  const std::vector<engine::OffloadCandidate> c = {Candidate("a", 160), Candidate("b", 5000),
                                                   Candidate("c", 3000)};
  EXPECT_THAT(ChooseOffloads(c, {20, 1000}, {.low_watermark = 0.05}), ElementsAre("b"));
  // Above the watermark: none.
  EXPECT_THAT(ChooseOffloads(c, {60, 1000}, {.low_watermark = 0.05}), IsEmpty());
  // A higher watermark needs two.
  EXPECT_THAT(ChooseOffloads(c, {20, 1000}, {.low_watermark = 0.4}), ElementsAre("b", "c"));
}

TEST(OffloadPolicyTest, RulesCombineWithoutChoosingASequenceTwice) {
  const std::vector<engine::OffloadCandidate> c = {Candidate("a", 160), Candidate("b", 5000),
                                                   Candidate("c", 300)};
  EXPECT_THAT(ChooseOffloads(c, {0, 1000}, {.min_context_tokens = 4096, .low_watermark = 0.32}),
              ElementsAre("b", "c"));
}

}  // namespace
}  // namespace trident::worker
