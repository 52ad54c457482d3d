#include "common/controller_client/backoff.h"

#include "gtest/gtest.h"

namespace trident::controller_client {
namespace {

TEST(BackoffTest, GrowsGeometricallyUpToTheCeilingWithoutJitter) {
  Backoff backoff({.initial = absl::Milliseconds(10),
                   .max = absl::Milliseconds(50),
                   .multiplier = 2.0,
                   .jitter = 0.0},
                  /*seed=*/1);
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(10));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(20));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(40));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(50));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(50));
  EXPECT_EQ(backoff.attempts(), 5);
}

TEST(BackoffTest, ResetStartsAgainFromTheInitialDelay) {
  Backoff backoff({.initial = absl::Milliseconds(10), .max = absl::Seconds(1), .jitter = 0.0},
                  /*seed=*/1);
  backoff.Next();
  backoff.Next();
  backoff.Reset();
  EXPECT_EQ(backoff.attempts(), 0);
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(10));
}

TEST(BackoffTest, JitterStaysWithinItsFractionAndVaries) {
  Backoff backoff({.initial = absl::Milliseconds(100),
                   .max = absl::Milliseconds(100),
                   .multiplier = 1.0,
                   .jitter = 0.2},
                  /*seed=*/42);
  absl::Duration low = absl::InfiniteDuration();
  absl::Duration high = absl::ZeroDuration();
  for (int i = 0; i < 200; ++i) {
    const absl::Duration d = backoff.Next();
    EXPECT_GE(d, absl::Milliseconds(80));
    EXPECT_LE(d, absl::Milliseconds(120));
    low = std::min(low, d);
    high = std::max(high, d);
  }
  EXPECT_LT(low, high);
}

TEST(BackoffTest, SameSeedGivesTheSameDelays) {
  const BackoffOptions options{.initial = absl::Milliseconds(5), .max = absl::Seconds(1)};
  Backoff a(options, /*seed=*/7);
  Backoff b(options, /*seed=*/7);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.Next(), b.Next());
}

TEST(BackoffTest, ClampsNonsensicalOptions) {
  Backoff backoff({.initial = absl::ZeroDuration(),
                   .max = absl::ZeroDuration(),
                   .multiplier = 0.5,
                   .jitter = 3.0},
                  /*seed=*/1);
  for (int i = 0; i < 5; ++i) {
    const absl::Duration d = backoff.Next();
    EXPECT_GE(d, absl::ZeroDuration());
    EXPECT_LE(d, absl::Milliseconds(2));
  }
}

}  // namespace
}  // namespace trident::controller_client
