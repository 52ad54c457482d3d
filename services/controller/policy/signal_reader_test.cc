#include "services/controller/policy/signal_reader.h"

#include <cmath>

#include "common/testing/status_matchers.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/controller/prometheus/fake_metrics_source.h"

namespace trident::controller {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::trident::testing::StatusIs;
using trident::v1::ROLE_DECODE;
using trident::v1::ROLE_PREFILL;

std::vector<WorkerState> Cluster() {
  return {{.worker_id = "p0", .role = ROLE_PREFILL},
          {.worker_id = "p1", .role = ROLE_PREFILL},
          {.worker_id = "d0", .role = ROLE_DECODE},
          {.worker_id = "d1", .role = ROLE_DECODE},
          {.worker_id = "d2", .role = ROLE_DECODE, .serving = false}};
}

// Every per-worker series of the cluster, and the router's totals.
void PublishAll(FakeMetricsSource& source, const SignalQueries& q) {
  for (const auto& [worker, queued, kv] :
       std::vector<std::tuple<std::string, double, double>>{{"p0", 1000, 0.01},
                                                            {"p1", 3000, 0.02},
                                                            {"d0", 7, 0.4},
                                                            {"d1", 0, 0.6},
                                                            {"d2", 0, 0.9}}) {
    source.Set(q.queued_prefill_tokens_by_worker, queued, {{"worker", worker}});
    source.Set(q.kv_usage_ratio_by_worker, kv, {{"worker", worker}});
  }
  source.Set(q.prefill_tokens_per_second_per_worker, 12000);
  source.Set(q.ttft_p90_seconds, 0.3);
  source.Set(q.tpot_p90_seconds, 0.04);
  source.Set(q.requests_per_second, 20);
  source.Set(q.ttft_rejections_per_second, 1);
  source.Set(q.decode_rejections_per_second, 2);
  source.Set(q.decode_waiting_sequences, 5);
}

TEST(SignalReaderTest, DefaultQueriesUseTheRoutersMetricsAndTheRateWindow) {
  const SignalQueries q = DefaultSignalQueries(absl::Seconds(30));
  EXPECT_EQ(q.queued_prefill_tokens_by_worker,
            "max by (worker) (trident_router_worker_queued_prefill_tokens)");
  EXPECT_EQ(q.ttft_p90_seconds,
            "histogram_quantile(0.9, sum by (le) (rate(trident_router_ttft_seconds_bucket[30s])))");
  EXPECT_EQ(q.decode_rejections_per_second,
            "sum(rate(trident_router_requests_rejected_total{reason=~\"tpot|kv_capacity\"}[30s]))");
}

TEST(SignalReaderTest, AggregatesPerRoleWithTheMembershipsRoles) {
  FakeClock clock;
  FakeMetricsSource source(&clock);
  const SignalQueries q = DefaultSignalQueries();
  PublishAll(source, q);
  absl::StatusOr<ClusterSignals> signals = ReadClusterSignals(source, Cluster(), q);
  ASSERT_THAT(signals, StatusIs(absl::StatusCode::kOk));
  // Prefill workers' queues summed; decode workers' KV usage averaged over
  // the serving ones (d2 drains).
  EXPECT_DOUBLE_EQ(signals->prefill.queued_prefill_tokens, 4000);
  EXPECT_DOUBLE_EQ(signals->decode.kv_usage_ratio, 0.5);
  EXPECT_DOUBLE_EQ(signals->prefill.prefill_tokens_per_second_per_worker, 12000);
  EXPECT_DOUBLE_EQ(signals->prefill.ttft_p90_seconds, 0.3);
  EXPECT_DOUBLE_EQ(signals->decode.tpot_p90_seconds, 0.04);
  EXPECT_DOUBLE_EQ(signals->prefill.ttft_rejected_ratio, 0.05);
  EXPECT_DOUBLE_EQ(signals->decode.rejected_ratio, 0.1);
  EXPECT_DOUBLE_EQ(signals->decode.waiting_sequences, 5);
}

TEST(SignalReaderTest, OptionalSeriesMissingReadAsNoSignalOrZero) {
  FakeClock clock;
  FakeMetricsSource source(&clock);
  const SignalQueries q = DefaultSignalQueries();
  PublishAll(source, q);
  for (const std::string* query :
       {&q.prefill_tokens_per_second_per_worker, &q.ttft_p90_seconds, &q.tpot_p90_seconds,
        &q.requests_per_second, &q.ttft_rejections_per_second, &q.decode_rejections_per_second,
        &q.decode_waiting_sequences}) {
    source.Remove(*query);
  }
  absl::StatusOr<ClusterSignals> signals = ReadClusterSignals(source, Cluster(), q);
  ASSERT_THAT(signals, StatusIs(absl::StatusCode::kOk));
  EXPECT_TRUE(std::isnan(signals->prefill.prefill_tokens_per_second_per_worker));
  EXPECT_TRUE(std::isnan(signals->prefill.ttft_p90_seconds));
  EXPECT_TRUE(std::isnan(signals->decode.tpot_p90_seconds));
  EXPECT_EQ(signals->prefill.ttft_rejected_ratio, 0);
  EXPECT_EQ(signals->decode.rejected_ratio, 0);
  EXPECT_EQ(signals->decode.waiting_sequences, 0);
}

TEST(SignalReaderTest, RequiredPerWorkerSeriesMissingIsNotFoundNamingTheWorkers) {
  FakeClock clock;
  FakeMetricsSource source(&clock);
  const SignalQueries q = DefaultSignalQueries();
  PublishAll(source, q);
  source.Remove(q.queued_prefill_tokens_by_worker);
  EXPECT_THAT(ReadClusterSignals(source, Cluster(), q),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("trident_router_worker_queued_prefill_tokens"),
                             HasSubstr("prefill worker(s) p0, p1"))));
  // Series for other workers only count as missing too.
  source.Set(q.queued_prefill_tokens_by_worker, 5, {{"worker", "someone-else"}});
  EXPECT_THAT(ReadClusterSignals(source, Cluster(), q), StatusIs(absl::StatusCode::kNotFound));
  // One of the role's workers reporting is enough.
  source.Set(q.queued_prefill_tokens_by_worker, 5, {{"worker", "p1"}});
  absl::StatusOr<ClusterSignals> signals = ReadClusterSignals(source, Cluster(), q);
  ASSERT_THAT(signals, StatusIs(absl::StatusCode::kOk));
  EXPECT_EQ(signals->prefill.queued_prefill_tokens, 5);
  // A role with no serving worker needs none.
  source.Remove(q.kv_usage_ratio_by_worker);
  std::vector<WorkerState> prefill_only = Cluster();
  prefill_only.resize(2);
  signals = ReadClusterSignals(source, prefill_only, q);
  ASSERT_THAT(signals, StatusIs(absl::StatusCode::kOk));
  EXPECT_TRUE(std::isnan(signals->decode.kv_usage_ratio));
}

TEST(SignalReaderTest, SourceErrorsComeBackAsTheSourceGaveThem) {
  FakeClock clock;
  FakeMetricsSource source(&clock);
  const SignalQueries q = DefaultSignalQueries();
  PublishAll(source, q);
  source.SetError(absl::UnavailableError("prometheus at http://p:9090: unreachable"));
  EXPECT_THAT(ReadClusterSignals(source, Cluster(), q),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("http://p:9090")));
  source.SetError(absl::OkStatus());
  source.SetQueryError(q.tpot_p90_seconds, absl::InvalidArgumentError("bad_data: parse error"));
  EXPECT_THAT(ReadClusterSignals(source, Cluster(), q),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad_data")));
}

TEST(SignalReaderTest, SeveralSeriesForOneValueIsInvalidArgument) {
  FakeClock clock;
  FakeMetricsSource source(&clock);
  const SignalQueries q = DefaultSignalQueries();
  PublishAll(source, q);
  source.Set(q.ttft_p90_seconds, 0.2, {{"class", "batch"}});
  EXPECT_THAT(ReadClusterSignals(source, Cluster(), q),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 series")));
}

}  // namespace
}  // namespace trident::controller
