#include "services/router/admission/rolling_quantile.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace trident::router::admission {
namespace {

TEST(RollingQuantileTest, EmptyGivesTheFallback) {
  RollingQuantile q(8, absl::Seconds(10), 0.9);
  EXPECT_EQ(q.Quantile(0, 1.5), 1.5);
  EXPECT_EQ(q.QuantileAt(0, 2.5), 2.5);
}

TEST(RollingQuantileTest, TakesTheCeilOfQTimesNthSmallest) {
  RollingQuantile q(16, absl::Seconds(100), 0.9);
  // 10 outcomes 1..10, added out of order: ceil(0.9 * 10) = 9th smallest.
  for (double v : {7, 3, 10, 1, 9, 2, 8, 4, 6, 5}) q.Add(0, v);
  EXPECT_EQ(q.Quantile(1, 0), 9);
  EXPECT_EQ(q.QuantileAt(1, 0), 9);
  RollingQuantile median(16, absl::Seconds(100), 0.5);
  for (double v : {4, 1, 3, 2}) median.Add(0, v);
  EXPECT_EQ(median.Quantile(0, 0), 2);  // ceil(0.5 * 4) = 2nd smallest
}

TEST(RollingQuantileTest, KeepsTheNewestWindowAndIgnoresNonFinite) {
  RollingQuantile q(3, absl::Seconds(100), 1.0);
  q.Add(0, 100);
  q.Add(1, 1);
  q.Add(2, 2);
  q.Add(3, std::numeric_limits<double>::quiet_NaN());
  q.Add(3, std::numeric_limits<double>::infinity());
  EXPECT_EQ(q.size(), 3);
  EXPECT_EQ(q.Quantile(3, 0), 100);  // the max of {100, 1, 2}
  q.Add(4, 3);                       // 100 leaves
  EXPECT_EQ(q.Quantile(4, 0), 3);
  RollingQuantile zero(0, absl::Seconds(100), 1.0);  // a window below 1 is 1
  zero.Add(0, 5);
  zero.Add(1, 6);
  EXPECT_EQ(zero.size(), 1);
  EXPECT_EQ(zero.Quantile(1, 0), 6);
}

TEST(RollingQuantileTest, DropsOutcomesOlderThanMaxAge) {
  RollingQuantile q(16, absl::Seconds(10), 1.0);
  q.Add(0, 50);
  q.Add(5, 2);
  EXPECT_EQ(q.Quantile(10, 0), 50);     // 10 s old: still in
  EXPECT_EQ(q.QuantileAt(10.5, 0), 2);  // the const reader skips it
  EXPECT_EQ(q.size(), 2);               // and keeps it
  EXPECT_EQ(q.Quantile(10.5, 0), 2);    // the other drops it
  EXPECT_EQ(q.size(), 1);
  EXPECT_EQ(q.Quantile(16, 7), 7);  // all gone: the fallback
  EXPECT_EQ(q.size(), 0);
}

TEST(RollingQuantileTest, ClearEmptiesAndTheNextAddCounts) {
  RollingQuantile q(4, absl::Seconds(10), 1.0);
  q.Add(0, 9);
  EXPECT_EQ(q.Quantile(0, 0), 9);
  q.Clear();
  EXPECT_EQ(q.Quantile(0, -1), -1);
  q.Add(1, 4);
  EXPECT_EQ(q.Quantile(1, 0), 4);
}

}  // namespace
}  // namespace trident::router::admission
