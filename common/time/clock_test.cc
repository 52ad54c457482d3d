#include "common/time/clock.h"

#include "gtest/gtest.h"

namespace trident {
namespace {

TEST(FakeClockTest, StandsStillUntilAdvanced) {
  const absl::Time start = absl::FromUnixSeconds(1'700'000'000);
  FakeClock clock(start);
  EXPECT_EQ(clock.Now(), start);
  EXPECT_EQ(clock.Now(), start);

  clock.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(1500));

  clock.SetTime(start + absl::Seconds(10));
  EXPECT_EQ(clock.Now(), start + absl::Seconds(10));
}

TEST(FakeClockDeathTest, RefusesToGoBackwards) {
  FakeClock clock(absl::FromUnixSeconds(100));
  EXPECT_DEATH(clock.SetTime(absl::FromUnixSeconds(99)), "time only moves forward");
  EXPECT_DEATH(clock.Advance(absl::Seconds(-1)), "time only moves forward");
}

TEST(RealClockTest, IsMonotonicEnoughToOrderTwoReads) {
  const absl::Time first = Clock::Real()->Now();
  const absl::Time second = Clock::Real()->Now();
  EXPECT_LE(first, second);
  EXPECT_GT(first, absl::FromUnixSeconds(1'600'000'000));
}

}  // namespace
}  // namespace trident
