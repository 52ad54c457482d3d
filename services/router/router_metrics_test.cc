#include "services/router/router_metrics.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/telemetry/collected_series.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace trident::router {
namespace {

using ::testing::DoubleNear;

using Series = ::trident::telemetry::CollectedSeries;

Series Find(prometheus::Registry& registry, const std::string& name,
            const prometheus::Labels& labels) {
  return ::trident::telemetry::FindSeries(registry, name, labels);
}

double Value(prometheus::Registry& r, const std::string& name, const prometheus::Labels& labels) {
  const Series s = Find(r, name, labels);
  EXPECT_TRUE(s.found) << name;
  return s.value;
}

// Two classes: "interactive" (the default) and "batch".
admission::QosConfig TwoClasses() {
  admission::QosConfig qos;
  qos.classes.resize(2);
  qos.classes[0].name = "interactive";
  qos.classes[0].is_default = true;
  qos.classes[1].name = "batch";
  qos.default_index = 0;
  return qos;
}

class RouterMetricsTest : public ::testing::Test {
 protected:
  prometheus::Registry registry_;
  RouterMetrics metrics_{registry_, TwoClasses()};
  FakeClock clock_{absl::FromUnixSeconds(1000)};

  double InFlight(const std::string& stage) {
    return Value(registry_, "trident_router_requests_in_flight", {{"stage", stage}});
  }
  double Requests(const std::string& klass, const std::string& outcome) {
    return Value(registry_, "trident_router_requests_total",
                 {{"class", klass}, {"outcome", outcome}});
  }
};

TEST_F(RouterMetricsTest, EverySeriesOfEveryClassExistsAtZero) {
  for (const std::string klass : {"interactive", "batch", "unknown"}) {
    for (const std::string outcome : {"ok", "rejected", "cancelled", "error"}) {
      EXPECT_EQ(Requests(klass, outcome), 0) << klass << " " << outcome;
    }
    for (const std::string reason :
         {"ttft", "tpot", "kv_capacity", "no_workers", "class_capacity"}) {
      EXPECT_EQ(Value(registry_, "trident_router_requests_rejected_total",
                      {{"class", klass}, {"reason", reason}}),
                0);
    }
    for (const std::string h : {"trident_router_ttft_seconds", "trident_router_tpot_seconds",
                                "trident_router_itl_seconds", "trident_router_e2e_seconds"}) {
      const Series s = Find(registry_, h, {{"class", klass}});
      EXPECT_TRUE(s.found) << h << " " << klass;
      EXPECT_EQ(s.count, 0u);
    }
  }
  EXPECT_EQ(InFlight("prefill"), 0);
  EXPECT_EQ(InFlight("decode"), 0);
}

TEST_F(RouterMetricsTest, ClassLabelIsAConfiguredNameOrUnknown) {
  EXPECT_EQ(metrics_.ClassLabel(""), "interactive");
  EXPECT_EQ(metrics_.ClassLabel("interactive"), "interactive");
  EXPECT_EQ(metrics_.ClassLabel("batch"), "batch");
  EXPECT_EQ(metrics_.ClassLabel("made-up-by-a-client"), "unknown");
}

TEST_F(RouterMetricsTest, AFinishedRequestRecordsTtftTpotE2eAndItsStages) {
  const absl::Time arrival = clock_.Now();
  {
    RequestObserver request(&metrics_, &clock_, "batch", arrival);
    EXPECT_EQ(InFlight("prefill"), 1);
    EXPECT_EQ(InFlight("decode"), 0);
    clock_.Advance(absl::Milliseconds(200));
    request.OnToken();  // TTFT 0.2 s.
    clock_.Advance(absl::Milliseconds(30));
    request.OnPrefillDone();
    EXPECT_EQ(InFlight("prefill"), 0);
    EXPECT_EQ(InFlight("decode"), 1);
    request.OnPrefillDone();  // A second call changes nothing.
    EXPECT_EQ(InFlight("decode"), 1);
    for (int i = 0; i < 4; ++i) {
      clock_.Advance(absl::Milliseconds(50));
      request.OnToken();
    }
    // 5 tokens, the last 0.23 s after the first: TPOT 0.23 / 4.
    clock_.Advance(absl::Milliseconds(20));
    request.OnFinish(engine::FinishReason::kLength);
    EXPECT_EQ(request.tokens(), 5);
    request.OnFinish(engine::FinishReason::kError);  // Ignored.
    request.OnToken();                               // Ignored.
  }
  EXPECT_EQ(InFlight("prefill"), 0);
  EXPECT_EQ(InFlight("decode"), 0);
  EXPECT_EQ(Requests("batch", "ok"), 1);
  EXPECT_EQ(Requests("batch", "error"), 0);
  EXPECT_EQ(Requests("interactive", "ok"), 0);
  const Series ttft = Find(registry_, "trident_router_ttft_seconds", {{"class", "batch"}});
  EXPECT_EQ(ttft.count, 1u);
  EXPECT_THAT(ttft.sum, DoubleNear(0.2, 1e-9));
  const Series tpot = Find(registry_, "trident_router_tpot_seconds", {{"class", "batch"}});
  EXPECT_EQ(tpot.count, 1u);
  EXPECT_THAT(tpot.sum, DoubleNear(0.23 / 4, 1e-9));
  // Four gaps after the first token: 0.08 s (the prefill hand-over between),
  // then 0.05 s each.
  const Series itl = Find(registry_, "trident_router_itl_seconds", {{"class", "batch"}});
  EXPECT_EQ(itl.count, 4u);
  EXPECT_THAT(itl.sum, DoubleNear(0.23, 1e-9));
  const Series e2e = Find(registry_, "trident_router_e2e_seconds", {{"class", "batch"}});
  EXPECT_EQ(e2e.count, 1u);
  EXPECT_THAT(e2e.sum, DoubleNear(0.45, 1e-9));
  EXPECT_EQ(Find(registry_, "trident_router_ttft_seconds", {{"class", "interactive"}}).count, 0u);
}

TEST_F(RouterMetricsTest, AOneTokenRequestHasNoTpot) {
  {
    RequestObserver request(&metrics_, &clock_, "", clock_.Now());
    clock_.Advance(absl::Milliseconds(10));
    request.OnToken();
    request.OnFinish(engine::FinishReason::kStop);
    EXPECT_EQ(request.stage(), RequestStage::kPrefill);
  }
  EXPECT_EQ(Requests("interactive", "ok"), 1);
  EXPECT_EQ(Find(registry_, "trident_router_ttft_seconds", {{"class", "interactive"}}).count, 1u);
  EXPECT_EQ(Find(registry_, "trident_router_tpot_seconds", {{"class", "interactive"}}).count, 0u);
  EXPECT_EQ(Find(registry_, "trident_router_e2e_seconds", {{"class", "interactive"}}).count, 1u);
  EXPECT_EQ(InFlight("prefill"), 0);
}

TEST_F(RouterMetricsTest, CancelledAndFailedRequestsCountButObserveOnlyTtftAndItl) {
  {
    RequestObserver cancelled(&metrics_, &clock_, "batch", clock_.Now());
    clock_.Advance(absl::Milliseconds(100));
    cancelled.OnToken();
    cancelled.OnPrefillDone();
    clock_.Advance(absl::Milliseconds(100));
    cancelled.OnToken();
    cancelled.OnFinish(engine::FinishReason::kAborted);
  }
  {
    RequestObserver failed(&metrics_, &clock_, "batch", clock_.Now());
    failed.OnFinish(engine::FinishReason::kError);
  }
  {
    // Destroyed without a final event: an error.
    RequestObserver dropped(&metrics_, &clock_, "batch", clock_.Now());
    dropped.OnPrefillDone();
    EXPECT_EQ(InFlight("decode"), 1);
  }
  EXPECT_EQ(Requests("batch", "cancelled"), 1);
  EXPECT_EQ(Requests("batch", "error"), 2);
  EXPECT_EQ(Requests("batch", "ok"), 0);
  EXPECT_EQ(Find(registry_, "trident_router_ttft_seconds", {{"class", "batch"}}).count, 1u);
  EXPECT_EQ(Find(registry_, "trident_router_tpot_seconds", {{"class", "batch"}}).count, 0u);
  // The cancelled request's second token came 0.1 s after its first.
  const Series itl = Find(registry_, "trident_router_itl_seconds", {{"class", "batch"}});
  EXPECT_EQ(itl.count, 1u);
  EXPECT_THAT(itl.sum, DoubleNear(0.1, 1e-9));
  EXPECT_EQ(Find(registry_, "trident_router_e2e_seconds", {{"class", "batch"}}).count, 0u);
  EXPECT_EQ(InFlight("prefill"), 0);
  EXPECT_EQ(InFlight("decode"), 0);
}

TEST_F(RouterMetricsTest, RejectionsCountByReasonAndClassWithTheirPredictions) {
  admission::AdmissionDecision rejected;
  rejected.admitted = false;
  rejected.reason = admission::RejectReason::kTpot;
  rejected.predicted_ttft = absl::Milliseconds(300);
  rejected.predicted_tpot = absl::Milliseconds(80);
  metrics_.OnDecision("batch", rejected);
  rejected.reason = admission::RejectReason::kNoWorkers;
  rejected.predicted_ttft = absl::InfiniteDuration();
  rejected.predicted_tpot = absl::InfiniteDuration();
  metrics_.OnDecision("nope", rejected);

  EXPECT_EQ(Value(registry_, "trident_router_requests_rejected_total",
                  {{"class", "batch"}, {"reason", "tpot"}}),
            1);
  EXPECT_EQ(Value(registry_, "trident_router_requests_rejected_total",
                  {{"class", "batch"}, {"reason", "ttft"}}),
            0);
  EXPECT_EQ(Value(registry_, "trident_router_requests_rejected_total",
                  {{"class", "unknown"}, {"reason", "no_workers"}}),
            1);
  EXPECT_EQ(Requests("batch", "rejected"), 1);
  EXPECT_EQ(Requests("unknown", "rejected"), 1);
  const Series ttft = Find(registry_, "trident_router_admission_predicted_ttft_seconds",
                           {{"class", "batch"}, {"decision", "rejected"}});
  EXPECT_EQ(ttft.count, 1u);
  EXPECT_THAT(ttft.sum, DoubleNear(0.3, 1e-9));
  const Series tpot = Find(registry_, "trident_router_admission_predicted_tpot_seconds",
                           {{"class", "batch"}, {"decision", "rejected"}});
  EXPECT_EQ(tpot.count, 1u);
  EXPECT_THAT(tpot.sum, DoubleNear(0.08, 1e-9));
  // Infinite predictions (no candidate) are not observed.
  EXPECT_EQ(Find(registry_, "trident_router_admission_predicted_ttft_seconds",
                 {{"class", "unknown"}, {"decision", "rejected"}})
                .count,
            0u);

  admission::AdmissionDecision admitted;
  admitted.admitted = true;
  admitted.predicted_ttft = absl::Milliseconds(40);
  admitted.predicted_tpot = absl::Milliseconds(20);
  metrics_.OnDecision("", admitted);
  EXPECT_EQ(Find(registry_, "trident_router_admission_predicted_ttft_seconds",
                 {{"class", "interactive"}, {"decision", "admitted"}})
                .count,
            1u);
  // An admission is no outcome yet.
  EXPECT_EQ(Requests("interactive", "ok"), 0);
  EXPECT_EQ(Requests("interactive", "rejected"), 0);
  EXPECT_EQ(Value(registry_, "trident_router_admission_probes_total", {}), 0);
  admitted.probe = true;
  metrics_.OnDecision("", admitted);
  EXPECT_EQ(Value(registry_, "trident_router_admission_probes_total", {}), 1);

  metrics_.OnSubmitError("batch");
  EXPECT_EQ(Requests("batch", "error"), 1);
}

TEST_F(RouterMetricsTest, WorkerGaugesFollowLoadReportsUntilTheWorkerIsRemoved) {
  admission::WorkerLoadReport load;
  load.worker_id = "decode-1";
  load.queued_prefill_tokens = 512;
  load.running_sequences = 7;
  load.kv_blocks_total = 100;
  load.kv_blocks_free = 25;
  metrics_.UpdateWorkerLoad(load);
  EXPECT_EQ(
      Value(registry_, "trident_router_worker_queued_prefill_tokens", {{"worker", "decode-1"}}),
      512);
  EXPECT_EQ(Value(registry_, "trident_router_worker_running_sequences", {{"worker", "decode-1"}}),
            7);
  EXPECT_DOUBLE_EQ(
      Value(registry_, "trident_router_worker_kv_usage_ratio", {{"worker", "decode-1"}}), 0.75);
  load.kv_blocks_free = 100;
  metrics_.UpdateWorkerLoad(load);
  EXPECT_DOUBLE_EQ(
      Value(registry_, "trident_router_worker_kv_usage_ratio", {{"worker", "decode-1"}}), 0);

  metrics_.RemoveWorker("decode-1");
  EXPECT_FALSE(
      Find(registry_, "trident_router_worker_kv_usage_ratio", {{"worker", "decode-1"}}).found);
  EXPECT_FALSE(
      Find(registry_, "trident_router_worker_queued_prefill_tokens", {{"worker", "decode-1"}})
          .found);
  metrics_.RemoveWorker("never-seen");  // No-op.
}

TEST_F(RouterMetricsTest, ANullMetricsObserverRecordsNothing) {
  {
    RequestObserver request(nullptr, &clock_, "batch", clock_.Now());
    request.OnToken();
    request.OnPrefillDone();
    request.OnFinish(engine::FinishReason::kStop);
    EXPECT_EQ(request.tokens(), 1);
  }
  EXPECT_EQ(Requests("batch", "ok"), 0);
  EXPECT_EQ(InFlight("decode"), 0);
}

TEST(RouterMetricsBucketsTest, BucketsIncreaseStrictlyFromMillisecondsToMinutes) {
  for (const std::vector<double>& b : {TtftBuckets(), TpotBuckets(), E2eBuckets()}) {
    ASSERT_GE(b.size(), 10u);
    for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
  }
  EXPECT_LE(TtftBuckets().front(), 0.005);
  EXPECT_GE(TtftBuckets().back(), 60);
  EXPECT_LE(TpotBuckets().front(), 0.001);
  EXPECT_GE(E2eBuckets().back(), 300);
}

}  // namespace
}  // namespace trident::router
