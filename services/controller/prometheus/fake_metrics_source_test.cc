#include "services/controller/prometheus/fake_metrics_source.h"

#include "common/testing/status_matchers.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::controller {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::trident::testing::IsOkAndHolds;
using ::trident::testing::StatusIs;

constexpr char kQuery[] = "max by (worker) (x)";

std::vector<double> Values(const Series& series) {
  std::vector<double> values;
  for (const Sample& sample : series.samples) values.push_back(sample.value);
  return values;
}

TEST(FakeMetricsSourceTest, InstantQueryAnswersLatestSampleWithinLookback) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  FakeMetricsSource source(&clock);
  source.AddSample(kQuery, {{"worker", "a"}}, absl::FromUnixSeconds(990), 1);
  source.AddSample(kQuery, {{"worker", "a"}}, absl::FromUnixSeconds(995), 2);
  source.AddSample(kQuery, {{"worker", "b"}}, absl::FromUnixSeconds(693), 7);

  absl::StatusOr<QueryResult> now = source.Query({.promql = kQuery});
  ASSERT_THAT(now, StatusIs(absl::StatusCode::kOk));
  EXPECT_EQ(now->type, ResultType::kVector);
  // b's sample is 307 s old, past the 5-minute lookback.
  ASSERT_EQ(now->series.size(), 1u);
  EXPECT_EQ(now->series[0].labels, (Labels{{"worker", "a"}}));
  EXPECT_THAT(Values(now->series[0]), ElementsAre(2));

  absl::StatusOr<QueryResult> earlier =
      source.Query({.promql = kQuery, .time = absl::FromUnixSeconds(992)});
  ASSERT_THAT(earlier, StatusIs(absl::StatusCode::kOk));
  ASSERT_EQ(earlier->series.size(), 2u);
  EXPECT_THAT(Values(earlier->series[0]), ElementsAre(1));
  EXPECT_THAT(Values(earlier->series[1]), ElementsAre(7));
}

TEST(FakeMetricsSourceTest, UnknownOrRemovedQueryAnswersNoSeries) {
  FakeClock clock;
  FakeMetricsSource source(&clock);
  source.Set("y", 3);
  EXPECT_THAT(SingleValue(*source.Query({.promql = "y"}), "y"), IsOkAndHolds(3));
  source.Remove("y");
  EXPECT_THAT(source.Query({.promql = "y"})->series, IsEmpty());
  EXPECT_THAT(source.Query({.promql = "never set"})->series, IsEmpty());
}

TEST(FakeMetricsSourceTest, RangeQueryAnswersTheSampleInEffectAtEachStep) {
  FakeClock clock(absl::FromUnixSeconds(100));
  FakeMetricsSource source(&clock);
  source.AddSample(kQuery, {}, absl::FromUnixSeconds(10), 1);
  source.AddSample(kQuery, {}, absl::FromUnixSeconds(20), 2);
  absl::StatusOr<QueryResult> result = source.QueryRange({.promql = kQuery,
                                                          .start = absl::FromUnixSeconds(5),
                                                          .end = absl::FromUnixSeconds(25),
                                                          .step = absl::Seconds(5)});
  ASSERT_THAT(result, StatusIs(absl::StatusCode::kOk));
  EXPECT_EQ(result->type, ResultType::kMatrix);
  ASSERT_EQ(result->series.size(), 1u);
  EXPECT_THAT(Values(result->series[0]), ElementsAre(1, 1, 2, 2));
  EXPECT_THAT(source.QueryRange({.promql = kQuery,
                                 .start = absl::FromUnixSeconds(5),
                                 .end = absl::FromUnixSeconds(4),
                                 .step = absl::Seconds(1)}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(FakeMetricsSourceTest, InjectedErrorsFailCallsAndAreRecorded) {
  FakeClock clock;
  FakeMetricsSource source(&clock, "prometheus at http://fake:9090");
  source.Set("a", 1);
  source.SetQueryError("a", absl::InvalidArgumentError("bad_data: parse error"));
  EXPECT_THAT(source.Query({.promql = "a"}), StatusIs(absl::StatusCode::kInvalidArgument));
  source.SetQueryError("a", absl::OkStatus());
  EXPECT_THAT(source.Query({.promql = "a"}), StatusIs(absl::StatusCode::kOk));

  source.SetError(absl::UnavailableError("prometheus at http://fake:9090: unreachable"));
  EXPECT_THAT(source.Query({.promql = "a"}), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(source.QueryRange({.promql = "a", .step = absl::Seconds(1)}),
              StatusIs(absl::StatusCode::kUnavailable));
  source.SetError(absl::OkStatus());
  EXPECT_THAT(source.Query({.promql = "a"}), StatusIs(absl::StatusCode::kOk));

  EXPECT_THAT(source.queries(), ElementsAre("a", "a", "a", "a", "a"));
  EXPECT_EQ(source.Describe(), "prometheus at http://fake:9090");
}

}  // namespace
}  // namespace trident::controller
