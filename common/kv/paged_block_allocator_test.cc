#include "common/kv/paged_block_allocator.h"

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::kv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::trident::testing::IsOk;
using ::trident::testing::IsOkAndHolds;
using ::trident::testing::StatusIs;

TEST(PagedBlockAllocatorTest, FreshAllocatorHandsOutIdsInOrder) {
  PagedBlockAllocator allocator(8);
  EXPECT_EQ(allocator.num_total(), 8);
  EXPECT_EQ(allocator.num_free(), 8);
  EXPECT_EQ(allocator.num_used(), 0);
  EXPECT_THAT(allocator.Allocate(3), IsOkAndHolds(ElementsAre(0, 1, 2)));
  EXPECT_THAT(allocator.Allocate(2), IsOkAndHolds(ElementsAre(3, 4)));
  EXPECT_EQ(allocator.num_free(), 3);
  EXPECT_EQ(allocator.num_used(), 5);
  EXPECT_TRUE(allocator.IsAllocated(4));
  EXPECT_FALSE(allocator.IsAllocated(5));
}

TEST(PagedBlockAllocatorTest, AllocateZeroReturnsNothing) {
  PagedBlockAllocator allocator(2);
  EXPECT_THAT(allocator.Allocate(0), IsOkAndHolds(IsEmpty()));
  EXPECT_EQ(allocator.num_free(), 2);
}

TEST(PagedBlockAllocatorTest, NegativeCountIsInvalidArgument) {
  PagedBlockAllocator allocator(2);
  EXPECT_THAT(allocator.Allocate(-1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(allocator.num_free(), 2);
}

TEST(PagedBlockAllocatorTest, ExhaustionIsAllOrNothing) {
  PagedBlockAllocator allocator(4);
  ASSERT_THAT(allocator.Allocate(3), IsOk());
  EXPECT_THAT(allocator.Allocate(2),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("2 blocks requested")));
  EXPECT_EQ(allocator.num_free(), 1);
  EXPECT_EQ(allocator.num_used(), 3);
  EXPECT_THAT(allocator.Allocate(1), IsOkAndHolds(ElementsAre(3)));
  EXPECT_THAT(allocator.Allocate(1), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(allocator.num_free(), 0);
}

TEST(PagedBlockAllocatorTest, EmptyPoolIsExhaustedButAllowsZero) {
  PagedBlockAllocator allocator(0);
  EXPECT_THAT(allocator.Allocate(1), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(allocator.Allocate(0), IsOkAndHolds(IsEmpty()));
}

TEST(PagedBlockAllocatorTest, SingleBlocksFillTheLowestHoles) {
  PagedBlockAllocator allocator(6);
  ASSERT_THAT(allocator.Allocate(4), IsOk());  // 0..3
  ASSERT_THAT(allocator.Free({3, 1}), IsOk());
  EXPECT_EQ(allocator.num_free(), 4);
  EXPECT_THAT(allocator.Allocate(1), IsOkAndHolds(ElementsAre(1)));
  EXPECT_THAT(allocator.Allocate(1), IsOkAndHolds(ElementsAre(3)));
  EXPECT_THAT(allocator.Allocate(1), IsOkAndHolds(ElementsAre(4)));
}

TEST(PagedBlockAllocatorTest, ManyBlocksTakeTheFirstRunLongEnough) {
  PagedBlockAllocator allocator(16);
  ASSERT_THAT(allocator.Allocate(10), IsOk());  // 0..9
  ASSERT_THAT(allocator.Free({1, 2, 5, 6, 7}), IsOk());
  EXPECT_THAT(allocator.Allocate(3), IsOkAndHolds(ElementsAre(5, 6, 7)));
  EXPECT_THAT(allocator.Allocate(4), IsOkAndHolds(ElementsAre(10, 11, 12, 13)));
  EXPECT_THAT(allocator.Allocate(2), IsOkAndHolds(ElementsAre(1, 2)));
}

TEST(PagedBlockAllocatorTest, WithoutARunLongEnoughTheLowestFreeIdsAscending) {
  PagedBlockAllocator allocator(8);
  ASSERT_THAT(allocator.Allocate(8), IsOk());
  ASSERT_THAT(allocator.Free({6, 1, 4, 3}), IsOk());
  EXPECT_THAT(allocator.Allocate(3), IsOkAndHolds(ElementsAre(1, 3, 4)));
  EXPECT_THAT(allocator.Allocate(1), IsOkAndHolds(ElementsAre(6)));
  EXPECT_EQ(allocator.num_free(), 0);
}

TEST(PagedBlockAllocatorTest, AFreedSequenceComesBackAsTheSameRun) {
  // One sequence at a time, as when requests do not overlap: every reuse is
  // the same ascending run (a transfer's few large messages), never reversed.
  PagedBlockAllocator allocator(16);
  for (int round = 0; round < 4; ++round) {
    absl::StatusOr<std::vector<int32_t>> blocks = allocator.Allocate(5);
    ASSERT_THAT(blocks, IsOkAndHolds(ElementsAre(0, 1, 2, 3, 4))) << "round " << round;
    ASSERT_THAT(allocator.Free(*blocks), IsOk());
  }
}

TEST(PagedBlockAllocatorTest, DecodeGrowthLeavesARunForTheNextPrompt) {
  // Eight sequences: a 4-block prompt each, then eight decode blocks each,
  // taken in turn as a batch grows. Seven finish; the next prompt's
  // reservation is one run (one KV message per layer chunk), not the
  // interleaved ids the finished sequences held.
  constexpr int kSequences = 8;
  PagedBlockAllocator allocator(256);
  std::vector<std::vector<int32_t>> sequences(kSequences);
  for (auto& blocks : sequences) blocks = *allocator.Allocate(4);
  for (int step = 0; step < 8; ++step) {
    for (auto& blocks : sequences) blocks.push_back((*allocator.Allocate(1))[0]);
  }
  for (int i = 0; i + 1 < kSequences; ++i) ASSERT_THAT(allocator.Free(sequences[i]), IsOk());
  const std::vector<int32_t> prompt = *allocator.Allocate(20);
  ASSERT_EQ(prompt.size(), 20u);
  for (size_t i = 1; i < prompt.size(); ++i) {
    EXPECT_EQ(prompt[i], prompt[0] + static_cast<int32_t>(i)) << "not one run at " << i;
  }
}

TEST(PagedBlockAllocatorTest, RunsAcrossWordBoundaries) {
  PagedBlockAllocator allocator(200);
  ASSERT_THAT(allocator.Allocate(200), IsOk());
  std::vector<int32_t> hole;
  for (int32_t b = 60; b < 190; ++b) hole.push_back(b);
  ASSERT_THAT(allocator.Free(hole), IsOk());
  ASSERT_THAT(allocator.Free({10, 11}), IsOk());
  const std::vector<int32_t> run = *allocator.Allocate(130);
  EXPECT_EQ(run.front(), 60);
  EXPECT_EQ(run.back(), 189);
  EXPECT_THAT(allocator.Allocate(3), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(allocator.Allocate(2), IsOkAndHolds(ElementsAre(10, 11)));
}

TEST(PagedBlockAllocatorTest, DoubleFreeFailsAndFreesNothing) {
  PagedBlockAllocator allocator(4);
  ASSERT_THAT(allocator.Allocate(3), IsOk());
  ASSERT_THAT(allocator.Free({0}), IsOk());
  EXPECT_THAT(allocator.Free({1, 0}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("double free")));
  // Block 1 was not freed by the failed call.
  EXPECT_TRUE(allocator.IsAllocated(1));
  EXPECT_EQ(allocator.num_free(), 2);
  EXPECT_THAT(allocator.Free({1}), IsOk());
}

TEST(PagedBlockAllocatorTest, RepeatedIdWithinOneCallIsADoubleFree) {
  PagedBlockAllocator allocator(4);
  ASSERT_THAT(allocator.Allocate(2), IsOk());
  EXPECT_THAT(allocator.Free({0, 1, 0}), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(allocator.IsAllocated(0));
  EXPECT_TRUE(allocator.IsAllocated(1));
  EXPECT_EQ(allocator.num_used(), 2);
}

TEST(PagedBlockAllocatorTest, OutOfRangeFreeFailsAndFreesNothing) {
  PagedBlockAllocator allocator(4);
  ASSERT_THAT(allocator.Allocate(4), IsOk());
  EXPECT_THAT(allocator.Free({2, 4}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("outside [0, 4)")));
  EXPECT_THAT(allocator.Free({-1}), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(allocator.num_used(), 4);
  EXPECT_TRUE(allocator.IsAllocated(2));
}

TEST(PagedBlockAllocatorTest, FreeingNeverAllocatedBlockFails) {
  PagedBlockAllocator allocator(4);
  EXPECT_THAT(allocator.Free({0}), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(allocator.num_free(), 4);
}

TEST(PagedBlockAllocatorTest, ChurnKeepsIdsDistinctAndCountsConsistent) {
  // Deterministic churn: allocate and free in a fixed pattern, checking that
  // no id is ever handed out twice while held.
  constexpr int32_t kBlocks = 64;
  PagedBlockAllocator allocator(kBlocks);
  std::vector<std::vector<int32_t>> held;
  absl::flat_hash_set<int32_t> live;
  for (int round = 0; round < 500; ++round) {
    const int32_t want = 1 + round % 7;
    absl::StatusOr<std::vector<int32_t>> got = allocator.Allocate(want);
    if (got.ok()) {
      ASSERT_EQ(got->size(), static_cast<size_t>(want));
      for (const int32_t b : *got) {
        ASSERT_GE(b, 0);
        ASSERT_LT(b, kBlocks);
        ASSERT_TRUE(live.insert(b).second) << "block " << b << " handed out twice";
      }
      held.push_back(*std::move(got));
    } else {
      ASSERT_THAT(got, StatusIs(absl::StatusCode::kResourceExhausted));
      ASSERT_LT(allocator.num_free(), want);
    }
    if (round % 3 == 2 && !held.empty()) {
      const size_t victim = round % held.size();
      ASSERT_THAT(allocator.Free(held[victim]), IsOk());
      for (const int32_t b : held[victim]) live.erase(b);
      held.erase(held.begin() + victim);
    }
    ASSERT_EQ(allocator.num_used(), static_cast<int32_t>(live.size()));
    ASSERT_EQ(allocator.num_free() + allocator.num_used(), kBlocks);
  }
  for (const std::vector<int32_t>& blocks : held) ASSERT_THAT(allocator.Free(blocks), IsOk());
  EXPECT_EQ(allocator.num_free(), kBlocks);
}

}  // namespace
}  // namespace trident::kv
