#include "common/numa/range_allocator.h"

#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::numa {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::IsOkAndHolds;
using ::trident::testing::StatusIs;

constexpr int64_t kUnit = 4096;

TEST(RangeAllocatorTest, RoundsLengthsUpToTheAlignment) {
  RangeAllocator ranges(/*capacity_bytes=*/16 * kUnit, /*alignment_bytes=*/kUnit);
  EXPECT_THAT(ranges.Allocate(1), IsOkAndHolds(ByteRange{0, kUnit}));
  EXPECT_THAT(ranges.Allocate(kUnit + 1), IsOkAndHolds(ByteRange{kUnit, 2 * kUnit}));
  EXPECT_THAT(ranges.Allocate(kUnit), IsOkAndHolds(ByteRange{3 * kUnit, kUnit}));
  EXPECT_EQ(ranges.used_bytes(), 4 * kUnit);
  EXPECT_EQ(ranges.free_bytes(), 12 * kUnit);
  EXPECT_EQ(ranges.largest_free_range(), 12 * kUnit);
  EXPECT_EQ(ranges.num_allocated_ranges(), 3);
}

TEST(RangeAllocatorTest, RejectsEmptyRequestsAndUnknownFrees) {
  RangeAllocator ranges(4 * kUnit, kUnit);
  EXPECT_THAT(ranges.Allocate(0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ranges.Allocate(-5), StatusIs(absl::StatusCode::kInvalidArgument));
  absl::StatusOr<ByteRange> range = ranges.Allocate(kUnit);
  ASSERT_THAT(range, IsOk());
  EXPECT_THAT(ranges.Free({range->offset, range->length + kUnit}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ranges.Free({range->offset + kUnit, kUnit}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT(ranges.Free(*range), IsOk());
  EXPECT_THAT(ranges.Free(*range),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not an allocated range")));
  EXPECT_EQ(ranges.used_bytes(), 0);
  EXPECT_EQ(ranges.num_free_ranges(), 1);
}

TEST(RangeAllocatorTest, FullArenaIsResourceExhaustedWithTheByteCounts) {
  RangeAllocator ranges(4 * kUnit, kUnit);
  ASSERT_THAT(ranges.Allocate(3 * kUnit), IsOk());
  EXPECT_THAT(ranges.Allocate(2 * kUnit),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("cannot allocate 8192 bytes"), HasSubstr("4096 bytes free"),
                             HasSubstr("largest free range 4096 bytes"))));
  EXPECT_THAT(ranges.Allocate(std::numeric_limits<int64_t>::max()),
              StatusIs(absl::StatusCode::kResourceExhausted));
  ASSERT_THAT(ranges.Allocate(kUnit), IsOk());
  EXPECT_EQ(ranges.largest_free_range(), 0);
  EXPECT_EQ(ranges.num_free_ranges(), 0);
  EXPECT_THAT(ranges.Allocate(1),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("0 bytes free")));
}

TEST(RangeAllocatorTest, FragmentedFreeSpaceCannotServeALargerRangeUntilCoalesced) {
  RangeAllocator ranges(8 * kUnit, kUnit);
  std::vector<ByteRange> allocated;
  for (int i = 0; i < 8; ++i) allocated.push_back(*ranges.Allocate(kUnit));
  for (int i = 0; i < 8; i += 2) ASSERT_THAT(ranges.Free(allocated[i]), IsOk());
  // Half the arena is free, in four holes of one unit.
  EXPECT_EQ(ranges.free_bytes(), 4 * kUnit);
  EXPECT_EQ(ranges.num_free_ranges(), 4);
  EXPECT_EQ(ranges.largest_free_range(), kUnit);
  EXPECT_THAT(ranges.Allocate(2 * kUnit),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("16384 bytes free"), HasSubstr("largest free range 4096"),
                             HasSubstr("4 free ranges"))));
  // Freeing unit 1 joins holes 0 and 2 into one of three units.
  ASSERT_THAT(ranges.Free(allocated[1]), IsOk());
  EXPECT_EQ(ranges.num_free_ranges(), 3);
  EXPECT_EQ(ranges.largest_free_range(), 3 * kUnit);
  EXPECT_THAT(ranges.Allocate(2 * kUnit), IsOkAndHolds(ByteRange{0, 2 * kUnit}));
  ASSERT_THAT(ranges.Free({0, 2 * kUnit}), IsOk());
  for (int i = 3; i < 8; i += 2) ASSERT_THAT(ranges.Free(allocated[i]), IsOk());
  EXPECT_EQ(ranges.num_free_ranges(), 1);
  EXPECT_EQ(ranges.largest_free_range(), 8 * kUnit);
  EXPECT_EQ(ranges.used_bytes(), 0);
}

TEST(RangeAllocatorTest, TakesTheSmallestHoleThatFits) {
  RangeAllocator ranges(10 * kUnit, kUnit);
  const ByteRange a = *ranges.Allocate(3 * kUnit);  // [0, 3)
  const ByteRange b = *ranges.Allocate(kUnit);      // [3, 4)
  const ByteRange c = *ranges.Allocate(kUnit);      // [4, 5)
  const ByteRange d = *ranges.Allocate(kUnit);      // [5, 6); [6, 10) stays free.
  ASSERT_THAT(ranges.Free(a), IsOk());
  ASSERT_THAT(ranges.Free(c), IsOk());
  // Holes of 3, 1 and 4 units: one unit goes into the one-unit hole.
  EXPECT_THAT(ranges.Allocate(kUnit), IsOkAndHolds(ByteRange{4 * kUnit, kUnit}));
  // Two units into the three-unit hole, not the four-unit tail.
  EXPECT_THAT(ranges.Allocate(2 * kUnit), IsOkAndHolds(ByteRange{0, 2 * kUnit}));
  EXPECT_THAT(ranges.Allocate(4 * kUnit), IsOkAndHolds(ByteRange{6 * kUnit, 4 * kUnit}));
  static_cast<void>(b);
  static_cast<void>(d);
}

TEST(RangeAllocatorTest, SmallAlignmentPacksRangesTightly) {
  RangeAllocator ranges(/*capacity_bytes=*/1024, /*alignment_bytes=*/64);
  EXPECT_THAT(ranges.Allocate(1), IsOkAndHolds(ByteRange{0, 64}));
  EXPECT_THAT(ranges.Allocate(65), IsOkAndHolds(ByteRange{64, 128}));
  EXPECT_EQ(ranges.free_bytes(), 1024 - 192);
}

// Random allocations and frees against a model of which units are taken:
// ranges never overlap, the counters agree, and freeing everything leaves
// one range.
TEST(RangeAllocatorTest, RandomWorkloadKeepsRangesDisjointAndCoalescesToOne) {
  const uint32_t seed = 20240611;
  std::cout << "seed " << seed << "\n";
  std::mt19937 random(seed);
  constexpr int kUnits = 512;
  RangeAllocator ranges(kUnits * kUnit, kUnit);
  std::vector<bool> taken(kUnits, false);
  std::vector<ByteRange> live;
  int64_t model_used = 0;
  for (int step = 0; step < 20000; ++step) {
    const bool allocate = live.empty() || random() % 100 < 55;
    if (allocate) {
      const int64_t bytes = 1 + static_cast<int64_t>(random() % (24 * kUnit));
      absl::StatusOr<ByteRange> range = ranges.Allocate(bytes);
      if (!range.ok()) {
        ASSERT_THAT(range, StatusIs(absl::StatusCode::kResourceExhausted)) << "step " << step;
        EXPECT_LT(ranges.largest_free_range(), bytes);
        continue;
      }
      ASSERT_EQ(range->offset % kUnit, 0);
      ASSERT_EQ(range->length, (bytes + kUnit - 1) / kUnit * kUnit);
      for (int64_t u = range->offset / kUnit; u < (range->offset + range->length) / kUnit; ++u) {
        ASSERT_FALSE(taken[u]) << "unit " << u << " handed out twice at step " << step;
        taken[u] = true;
      }
      model_used += range->length;
      live.push_back(*range);
    } else {
      const size_t index = random() % live.size();
      const ByteRange range = live[index];
      live[index] = live.back();
      live.pop_back();
      ASSERT_THAT(ranges.Free(range), IsOk());
      for (int64_t u = range.offset / kUnit; u < (range.offset + range.length) / kUnit; ++u) {
        taken[u] = false;
      }
      model_used -= range.length;
    }
    ASSERT_EQ(ranges.used_bytes(), model_used);
  }
  for (const ByteRange& range : live) ASSERT_THAT(ranges.Free(range), IsOk());
  EXPECT_EQ(ranges.num_free_ranges(), 1);
  EXPECT_EQ(ranges.largest_free_range(), kUnits * kUnit);
}

TEST(RangeAllocatorTest, ConcurrentAllocateAndFreeLeaveItEmpty) {
  RangeAllocator ranges(256 * kUnit, kUnit);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&ranges, t] {
      std::vector<ByteRange> mine;
      for (int i = 0; i < 2000; ++i) {
        absl::StatusOr<ByteRange> range = ranges.Allocate((1 + (i + t) % 7) * kUnit);
        if (range.ok()) mine.push_back(*range);
        if (mine.size() > 8 || (!range.ok() && !mine.empty())) {
          EXPECT_THAT(ranges.Free(mine.front()), IsOk());
          mine.erase(mine.begin());
        }
      }
      for (const ByteRange& range : mine) EXPECT_THAT(ranges.Free(range), IsOk());
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(ranges.used_bytes(), 0);
  EXPECT_EQ(ranges.num_free_ranges(), 1);
}

}  // namespace
}  // namespace trident::numa
