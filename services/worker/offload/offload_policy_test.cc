#include "services/worker/offload/offload_policy.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<std::string> Ids(const std::vector<OffloadChoice>& choices) {
  std::vector<std::string> ids;
  for (const OffloadChoice& c : choices) ids.push_back(c.id);
  return ids;
}

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
  EXPECT_THAT(Ids(ChooseOffloads(c, {100, 1000}, {.min_context_tokens = 2048, .max_moves = 3})),
              ElementsAre("b", "e", "c"));
  EXPECT_THAT(Ids(ChooseOffloads(c, {100, 1000}, {.min_context_tokens = 2048, .max_moves = 8})),
              ElementsAre("b", "e", "c", "d"));
}

TEST(OffloadPolicyTest, NothingMovesWithBothRulesOff) {
  const std::vector<engine::OffloadCandidate> c = {Candidate("a", 100000)};
  EXPECT_THAT(Ids(ChooseOffloads(c, {0, 1000}, {})), IsEmpty());
}

TEST(OffloadPolicyTest, PoolPressureMovesTheLongestUntilTheWatermarkHolds) {
  // 1000 blocks, 20 free: below 5%. Moving "b" (313 blocks) restores it.
  const std::vector<engine::OffloadCandidate> c = {Candidate("a", 160), Candidate("b", 5000),
                                                   Candidate("c", 3000)};
  EXPECT_THAT(Ids(ChooseOffloads(c, {20, 1000}, {.low_watermark = 0.05})), ElementsAre("b"));
  // Above the watermark: none.
  EXPECT_THAT(Ids(ChooseOffloads(c, {60, 1000}, {.low_watermark = 0.05})), IsEmpty());
  // A higher watermark needs two.
  EXPECT_THAT(Ids(ChooseOffloads(c, {20, 1000}, {.low_watermark = 0.4})), ElementsAre("b", "c"));
}

TEST(OffloadPolicyTest, AWaitingSequenceThatCannotStartMovesEnoughOut) {
  // 100 blocks, 10 free (above a 5% watermark); the first waiting sequence
  // needs 16 to start its prompt: "b" (19 blocks) goes, and with 40 wanted
  // "c" (17) too.
  const std::vector<engine::OffloadCandidate> c = {Candidate("a", 160), Candidate("b", 300),
                                                   Candidate("c", 272)};
  EXPECT_THAT(Ids(ChooseOffloads(c, {10, 100}, {.low_watermark = 0.05})), IsEmpty());
  EXPECT_THAT(Ids(ChooseOffloads(c, {10, 100, 16}, {.low_watermark = 0.05})), ElementsAre("b"));
  EXPECT_THAT(Ids(ChooseOffloads(c, {10, 100, 40}, {.low_watermark = 0.05})),
              ElementsAre("b", "c"));
  // One that could never fit the pool moves nothing; nor does rule 2 off.
  EXPECT_THAT(Ids(ChooseOffloads(c, {10, 100, 101}, {.low_watermark = 0.05})), IsEmpty());
  EXPECT_THAT(Ids(ChooseOffloads(c, {10, 100, 16}, {})), IsEmpty());
}

TEST(OffloadPolicyTest, RulesCombineWithoutChoosingASequenceTwice) {
  const std::vector<engine::OffloadCandidate> c = {Candidate("a", 160), Candidate("b", 5000),
                                                   Candidate("c", 300)};
  const std::vector<OffloadChoice> chosen =
      ChooseOffloads(c, {0, 1000}, {.min_context_tokens = 4096, .low_watermark = 0.32});
  EXPECT_THAT(Ids(chosen), ElementsAre("b", "c"));
  ASSERT_EQ(chosen.size(), 2u);
  EXPECT_EQ(chosen[0].rule, OffloadRule::kLongContext);
  EXPECT_EQ(chosen[1].rule, OffloadRule::kPoolPressure);
}

}  // namespace
}  // namespace trident::worker
