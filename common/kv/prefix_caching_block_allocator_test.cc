#include "common/kv/prefix_caching_block_allocator.h"

#include <random>
#include <vector>

#include "common/kv/block_hasher.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::kv {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

BlockKey Key(uint64_t n) { return BlockKey{n, n * 7 + 1}; }

TEST(PrefixCachingBlockAllocatorTest, PublishedBlocksOutliveTheirHolder) {
  PrefixCachingBlockAllocator a(4);
  auto blocks = a.Allocate(2);
  ASSERT_THAT(blocks.status(), IsOk());
  EXPECT_TRUE(a.Publish((*blocks)[0], Key(1)));
  EXPECT_TRUE(a.Publish((*blocks)[1], Key(2)));
  ASSERT_THAT(a.Free(*blocks), IsOk());
  EXPECT_EQ(a.num_cached(), 2);
  EXPECT_EQ(a.num_free(), 4);  // Cached blocks are available to Allocate.
  EXPECT_THAT(a.CheckInvariants(), IsOk());

  // The chain matches from the first key and stops at the first miss.
  EXPECT_THAT(a.AcquireCached({Key(1), Key(2), Key(3)}), ElementsAre((*blocks)[0], (*blocks)[1]));
  EXPECT_THAT(a.AcquireCached({Key(2)}), ElementsAre((*blocks)[1]));
  EXPECT_THAT(a.AcquireCached({Key(9), Key(1)}), IsEmpty());
  EXPECT_EQ(a.RefCountForTesting((*blocks)[0]), 1);
  EXPECT_EQ(a.RefCountForTesting((*blocks)[1]), 2);
  EXPECT_EQ(a.num_cached(), 0);
  EXPECT_THAT(a.CheckInvariants(), IsOk());
}

TEST(PrefixCachingBlockAllocatorTest, SharedBlockReturnsOnlyWithItsLastHolder) {
  PrefixCachingBlockAllocator a(2);
  auto first = a.Allocate(1);
  ASSERT_TRUE(a.Publish((*first)[0], Key(5)));
  auto second = a.AcquireCached({Key(5)});
  ASSERT_THAT(second, ElementsAre((*first)[0]));
  ASSERT_THAT(a.Free(*first), IsOk());
  EXPECT_EQ(a.num_used(), 1);  // The other holder still has it.
  EXPECT_EQ(a.num_cached(), 0);
  ASSERT_THAT(a.Free(second), IsOk());
  EXPECT_EQ(a.num_cached(), 1);
  EXPECT_THAT(a.Free(second), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(a.CheckInvariants(), IsOk());
}

TEST(PrefixCachingBlockAllocatorTest, EvictsOnlyWhatIsMissingTailFirst) {
  PrefixCachingBlockAllocator a(4);
  std::vector<BlockKey> evicted;
  a.set_eviction_listener([&](const BlockKey& k) { evicted.push_back(k); });
  auto seq = a.Allocate(3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(a.Publish((*seq)[i], Key(i)));
  ASSERT_THAT(a.Free(*seq), IsOk());  // Token order: 0, 1, 2.

  // One truly free block remains: taking 2 evicts exactly one, the tail.
  auto more = a.Allocate(2);
  ASSERT_THAT(more.status(), IsOk());
  EXPECT_THAT(evicted, ElementsAre(Key(2)));
  EXPECT_EQ(a.num_cached(), 2);
  // The prefix still matches; its continuation does not.
  EXPECT_THAT(a.AcquireCached({Key(0), Key(1), Key(2)}), ElementsAre((*seq)[0], (*seq)[1]));
  EXPECT_THAT(a.Allocate(1), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(a.num_evicted(), 1);
  EXPECT_THAT(a.CheckInvariants(), IsOk());
}

TEST(PrefixCachingBlockAllocatorTest, DuplicateKeyLeavesTheSecondBlockUnnamed) {
  PrefixCachingBlockAllocator a(2);
  auto x = a.Allocate(1);
  auto y = a.Allocate(1);
  EXPECT_TRUE(a.Publish((*x)[0], Key(1)));
  EXPECT_FALSE(a.Publish((*y)[0], Key(1)));
  EXPECT_FALSE(a.Publish((*x)[0], Key(2)));  // Named already.
  ASSERT_THAT(a.Free(*y), IsOk());
  EXPECT_EQ(a.num_cached(), 0);  // The duplicate went straight back to the pool.
  EXPECT_THAT(a.CheckInvariants(), IsOk());
}

TEST(PrefixCachingBlockAllocatorTest, RejectsBadFreesAllOrNothing) {
  PrefixCachingBlockAllocator a(3);
  auto b = a.Allocate(2);
  EXPECT_THAT(a.Free({(*b)[0], 7}), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(a.Free({(*b)[0], (*b)[0]}), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(a.num_used(), 2);
  EXPECT_THAT(a.Allocate(-1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(a.CheckInvariants(), IsOk());
}

// Random operations against the invariants: every block free, cached or
// held; counts and the key index consistent after each step.
TEST(PrefixCachingBlockAllocatorTest, InvariantsHoldUnderRandomOperations) {
  const uint32_t seed = 20261127;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  PrefixCachingBlockAllocator a(32);
  std::vector<std::vector<int32_t>> holders;
  for (int step = 0; step < 5000; ++step) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0) {
      auto got = a.Allocate(static_cast<int32_t>(rng() % 5));
      if (got.ok()) holders.push_back(*got);
    } else if (op == 1 && !holders.empty()) {
      auto& h = holders[rng() % holders.size()];
      for (int32_t b : h) a.Publish(b, Key(rng() % 40));
    } else if (op == 2 && !holders.empty()) {
      const size_t i = rng() % holders.size();
      ASSERT_THAT(a.Free(holders[i]), IsOk());
      holders.erase(holders.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      // A chain's keys are distinct (they hash their parents).
      const uint64_t first = rng() % 38;
      const std::vector<BlockKey> keys = {Key(first), Key(first + 1), Key(first + 2)};
      std::vector<int32_t> got = a.AcquireCached(keys);
      if (!got.empty()) holders.push_back(got);
    }
    ASSERT_THAT(a.CheckInvariants(), IsOk()) << "step " << step;
  }
  for (const auto& h : holders) ASSERT_THAT(a.Free(h), IsOk());
  EXPECT_EQ(a.num_used(), 0);
  EXPECT_THAT(a.CheckInvariants(), IsOk());
}

}  // namespace
}  // namespace trident::kv
