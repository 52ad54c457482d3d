#include "common/kv/fake_block_allocator.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::kv {
namespace {

using ::testing::ElementsAre;
using ::trident::testing::IsOk;
using ::trident::testing::IsOkAndHolds;
using ::trident::testing::StatusIs;

TEST(FakeBlockAllocatorTest, HandsOutLowestFreeIds) {
  FakeBlockAllocator allocator(4);
  EXPECT_THAT(allocator.Allocate(2), IsOkAndHolds(ElementsAre(0, 1)));
  ASSERT_THAT(allocator.Free({0}), IsOk());
  EXPECT_THAT(allocator.Allocate(2), IsOkAndHolds(ElementsAre(0, 2)));
  EXPECT_EQ(allocator.num_used(), 3);
  EXPECT_THAT(allocator.Allocate(2), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(allocator.num_free(), 1);
}

TEST(FakeBlockAllocatorTest, RejectsBadFreesWithoutFreeing) {
  FakeBlockAllocator allocator(4);
  ASSERT_THAT(allocator.Allocate(2), IsOk());
  EXPECT_THAT(allocator.Free({1, 1}), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(allocator.Free({0, 3}), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(allocator.Free({0, 7}), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(allocator.num_used(), 2);
}

TEST(FakeBlockAllocatorTest, FailNextAllocateFailsOnce) {
  FakeBlockAllocator allocator(4);
  allocator.FailNextAllocate(absl::ResourceExhaustedError("injected"));
  EXPECT_THAT(allocator.Allocate(1), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(allocator.num_free(), 4);
  EXPECT_THAT(allocator.Allocate(1), IsOkAndHolds(ElementsAre(0)));
  EXPECT_EQ(allocator.num_allocate_calls(), 2);
}

}  // namespace
}  // namespace trident::kv
