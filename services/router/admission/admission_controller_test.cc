#include "services/router/admission/admission_controller.h"

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/status/error_details.h"
#include "common/testing/status_matchers.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::router::admission {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

// Models with known, fixed coefficients: reports carry no throughput or step
// time, so the priors are what the controller predicts with.
//   prefill: 10 ms + n / 10,000 s;  decode step: 10 ms + 1 ms * batch.
AdmissionOptions KnownModelOptions() {
  AdmissionOptions options;
  options.slo_margin = 1.0;  // Exact thresholds; SloMarginLeavesHeadroom covers the margin.
  // Decisions on predictions alone; the IdleProbe tests cover probes.
  options.idle_probe_interval = absl::ZeroDuration();
  options.kv_block_size_tokens = 16;
  options.prefill_model.prior_fixed_time = absl::Milliseconds(10);
  options.prefill_model.prior_tokens_per_second = 10000;
  options.decode_model.prior_step_fixed = absl::Milliseconds(10);
  options.decode_model.prior_per_sequence = absl::Milliseconds(1);
  options.decode_model.prior_per_context_token = absl::ZeroDuration();
  return options;
}

WorkerLoadReport PrefillLoad(std::string id, int64_t queued_tokens = 0, int32_t waiting = 0) {
  WorkerLoadReport report;
  report.worker_id = std::move(id);
  report.role = WorkerRole::kPrefill;
  report.queued_prefill_tokens = queued_tokens;
  report.waiting_sequences = waiting;
  return report;
}

WorkerLoadReport DecodeLoad(std::string id, int32_t running = 0, int32_t kv_blocks_free = 10000,
                            int32_t kv_blocks_total = 10000) {
  WorkerLoadReport report;
  report.worker_id = std::move(id);
  report.role = WorkerRole::kDecode;
  report.running_sequences = running;
  report.batch_context_tokens = 1000 * running;
  report.kv_blocks_free = kv_blocks_free;
  report.kv_blocks_total = kv_blocks_total;
  return report;
}

AdmissionRequest Request(int64_t prompt, int64_t max_output, absl::Duration ttft,
                         absl::Duration tpot) {
  AdmissionRequest request;
  request.prompt_tokens = prompt;
  request.max_output_tokens = max_output;
  request.ttft = ttft;
  request.tpot = tpot;
  return request;
}

class Cluster {
 public:
  explicit Cluster(AdmissionOptions options = KnownModelOptions(),
                   QosConfig qos = QosConfig::SingleDefaultClass())
      : clock_(absl::FromUnixSeconds(1'700'000'000)),
        controller_(std::move(options), std::move(qos), &clock_) {}

  void Load(const WorkerLoadReport& report) { ASSERT_THAT(controller_.UpdateLoad(report), IsOk()); }

  AdmissionDecision Admit(const AdmissionRequest& request) {
    absl::StatusOr<AdmissionDecision> decision = controller_.Admit(request);
    EXPECT_THAT(decision, IsOk());
    return decision.ok() ? *decision : AdmissionDecision();
  }

  FakeClock& clock() { return clock_; }
  AdmissionController& controller() { return controller_; }

 private:
  FakeClock clock_;
  AdmissionController controller_;
};

TEST(AdmissionControllerTest, PicksDecodeWithMostSlackThenFastestPrefill) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0", /*queued_tokens=*/5000));
  cluster.Load(PrefillLoad("p1"));
  cluster.Load(DecodeLoad("d0", /*running=*/10));
  cluster.Load(DecodeLoad("d1", /*running=*/2));

  const AdmissionDecision decision =
      cluster.Admit(Request(1000, 100, absl::Seconds(1), absl::Milliseconds(50)));

  ASSERT_TRUE(decision.admitted);
  EXPECT_NE(decision.id, 0u);
  EXPECT_EQ(decision.decode_worker_id, "d1");
  EXPECT_EQ(decision.prefill_worker_id, "p1");
  // 10 ms + 1000 / 10,000 s, no transfer (bytes_per_token 0).
  EXPECT_NEAR(absl::ToDoubleSeconds(decision.predicted_ttft), 0.110, 1e-9);
  // Batch 2 running + this one: 10 ms + 3 ms.
  EXPECT_NEAR(absl::ToDoubleSeconds(decision.predicted_tpot), 0.013, 1e-9);
  EXPECT_EQ(cluster.controller().num_in_flight(), 1);
}

TEST(AdmissionControllerTest, AColdDecodeWorkerIsPredictedWithItsMeasuredPeersModel) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0"));
  // d0 has decoded: its steps take 2 ms, far below the 10 ms prior.
  for (int i = 0; i < 8; ++i) {
    WorkerLoadReport warm = DecodeLoad("d0", /*running=*/2);
    warm.decode_step_time = absl::Milliseconds(2);
    cluster.Load(warm);
  }
  // d1 just switched to decode: no steps of its own, idle.
  cluster.Load(DecodeLoad("d1", /*running=*/0));
  const AdmissionDecision decision =
      cluster.Admit(Request(100, 100, absl::Seconds(1), absl::InfiniteDuration()));
  ASSERT_TRUE(decision.admitted);
  // With the prior d1 would look 5x slower than d0 and never be chosen.
  EXPECT_EQ(decision.decode_worker_id, "d1");
  EXPECT_LT(absl::ToDoubleSeconds(decision.predicted_tpot), 0.005);
}

// A worker whose decode steps measured slow (its first ones, say, just after
// a switch from prefill) is priced out while a peer is faster; once it has
// decoded nothing for calibration_max_age it is priced with its busy peer's
// model again, so it is chosen and measured anew rather than never again.
TEST(AdmissionControllerTest, ADecodeModelNotSampledLatelyGivesWayToAFreshPeers) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0"));
  auto steps = [&](const std::string& id, int32_t running, absl::Duration step) {
    for (int i = 0; i < 8; ++i) {
      WorkerLoadReport report = DecodeLoad(id, running);
      report.decode_step_time = step;
      cluster.Load(report);
    }
  };
  steps("d0", 1, absl::Milliseconds(200));
  steps("d1", 3, absl::Milliseconds(5));
  cluster.Load(DecodeLoad("d0", /*running=*/0));
  const AdmissionRequest request = Request(100, 100, absl::Seconds(1), absl::InfiniteDuration());
  const AdmissionDecision slow = cluster.Admit(request);
  ASSERT_TRUE(slow.admitted);
  EXPECT_EQ(slow.decode_worker_id, "d1") << "d0 is priced at its 200 ms steps";
  cluster.controller().Release(slow.id);
  // d1 keeps decoding (fresh samples); d0 has been idle for longer than the
  // calibration's age limit.
  cluster.clock().Advance(KnownModelOptions().calibration_max_age + absl::Seconds(1));
  cluster.Load(PrefillLoad("p0"));
  steps("d1", 3, absl::Milliseconds(5));
  cluster.Load(DecodeLoad("d0", /*running=*/0));
  const AdmissionDecision again = cluster.Admit(request);
  ASSERT_TRUE(again.admitted);
  EXPECT_EQ(again.decode_worker_id, "d0");
  EXPECT_LT(absl::ToDoubleSeconds(again.predicted_tpot), 0.02);
}

TEST(AdmissionControllerTest, RejectsTtftViolationWithPositiveRetryAfter) {
  Cluster cluster;
  // 20,000 queued tokens: 2 s of backlog on the only prefill worker.
  cluster.Load(PrefillLoad("p0", /*queued_tokens=*/20000));
  cluster.Load(DecodeLoad("d0"));

  const AdmissionDecision decision =
      cluster.Admit(Request(1000, 100, absl::Milliseconds(500), absl::Milliseconds(50)));

  ASSERT_FALSE(decision.admitted);
  EXPECT_EQ(decision.reason, RejectReason::kTtft);
  EXPECT_EQ(RejectReasonName(decision.reason), "ttft");
  // Predicted 2 s + 0.11 s; the backlog must drain by 1.61 s first.
  EXPECT_NEAR(absl::ToDoubleSeconds(decision.predicted_ttft), 2.11, 1e-9);
  EXPECT_NEAR(absl::ToDoubleSeconds(decision.retry_after), 1.61, 1e-6);
  const absl::Status status = RejectionStatus(decision);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("reason ttft")));
  EXPECT_EQ(GetRetryDelay(status), decision.retry_after);
  EXPECT_EQ(cluster.controller().num_in_flight(), 0);

  // The reported backlog drains at the modelled rate: 1.61 s later it fits.
  cluster.clock().Advance(absl::Milliseconds(1611));
  EXPECT_TRUE(
      cluster.Admit(Request(1000, 100, absl::Milliseconds(500), absl::Milliseconds(50))).admitted);
}

TEST(AdmissionControllerTest, PrefillQueueCountsPromptsAdmittedSinceTheReport) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  const AdmissionRequest request =
      Request(2000, 10, absl::Milliseconds(500), absl::Milliseconds(500));
  // Each prompt adds 0.21 s to the queue: two fit in 500 ms, a third does not.
  EXPECT_TRUE(cluster.Admit(request).admitted);
  EXPECT_TRUE(cluster.Admit(request).admitted);
  const AdmissionDecision third = cluster.Admit(request);
  EXPECT_FALSE(third.admitted);
  EXPECT_EQ(third.reason, RejectReason::kTtft);
  EXPECT_NEAR(absl::ToDoubleSeconds(third.predicted_ttft), 0.63, 1e-9);
}

TEST(AdmissionControllerTest, TpotForecastCountsInFlightAdmissions) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  // 10 ms + 1 ms * batch <= 15 ms: at most 5 sequences.
  const AdmissionRequest request = Request(100, 1000, absl::Seconds(5), absl::Milliseconds(15));
  std::vector<AdmissionId> ids;
  for (int i = 0; i < 5; ++i) {
    const AdmissionDecision decision = cluster.Admit(request);
    ASSERT_TRUE(decision.admitted) << i;
    EXPECT_NEAR(absl::ToDoubleSeconds(decision.predicted_tpot), 0.010 + 0.001 * (i + 1), 1e-9);
    ids.push_back(decision.id);
  }
  // No worker has reported any of them yet; the sixth is still refused.
  const AdmissionDecision sixth = cluster.Admit(request);
  ASSERT_FALSE(sixth.admitted);
  EXPECT_EQ(sixth.reason, RejectReason::kTpot);
  EXPECT_NEAR(absl::ToDoubleSeconds(sixth.predicted_tpot), 0.016, 1e-9);
  // Retry when the first admitted sequence is predicted done: it decodes
  // 1000 tokens at 11 ms from its prefill end (0.02 s), 11.02 s; this
  // request's prefill would end at 0.12 s (five prompts of 20 ms ahead).
  EXPECT_GT(sixth.retry_after, absl::ZeroDuration());
  EXPECT_NEAR(absl::ToDoubleSeconds(sixth.retry_after), 10.9, 1e-6);

  // A report that counts them as running changes nothing (no double count).
  for (AdmissionId id : ids) cluster.controller().MarkPrefillDone(id);
  cluster.clock().Advance(absl::Milliseconds(1));
  cluster.Load(DecodeLoad("d0", /*running=*/5));
  const AdmissionDecision again = cluster.Admit(request);
  EXPECT_FALSE(again.admitted);
  EXPECT_NEAR(absl::ToDoubleSeconds(again.predicted_tpot), 0.016, 1e-9);  // Batch 6, not 11.

  // Releasing one makes room at once, before the next report.
  cluster.controller().Release(ids[0]);
  const AdmissionDecision after_release = cluster.Admit(request);
  ASSERT_TRUE(after_release.admitted);
  EXPECT_NEAR(absl::ToDoubleSeconds(after_release.predicted_tpot), 0.015, 1e-9);
}

TEST(AdmissionControllerTest, ForecastDropsSequencesPredictedToFinishBeforeOurPrefillEnds) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  // Five short sequences (2 tokens each, done ~30 ms after they start).
  for (int i = 0; i < 5; ++i) {
    const AdmissionDecision decision =
        cluster.Admit(Request(100, 2, absl::Seconds(5), absl::Milliseconds(15)));
    ASSERT_TRUE(decision.admitted);
    cluster.controller().MarkPrefillDone(decision.id);
  }
  cluster.Load(PrefillLoad("p0"));  // Their prompts are no longer queued.
  const AdmissionRequest request = Request(100, 100, absl::Seconds(5), absl::Milliseconds(15));

  // A prefill ending now-ish would join while they still run: batch 6.
  AdmissionDecision decision = cluster.Admit(request);
  ASSERT_FALSE(decision.admitted);
  EXPECT_EQ(decision.reason, RejectReason::kTpot);

  // With 0.5 s of prefill backlog, this request joins after they are done.
  cluster.Load(PrefillLoad("p0", /*queued_tokens=*/5000));
  decision = cluster.Admit(request);
  ASSERT_TRUE(decision.admitted);
  EXPECT_NEAR(absl::ToDoubleSeconds(decision.predicted_tpot), 0.011, 1e-9);
}

TEST(AdmissionControllerTest, CountsRunningSequencesOtherRoutersAdmitted) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0", /*running=*/5));
  const AdmissionDecision decision =
      cluster.Admit(Request(100, 100, absl::Seconds(5), absl::Milliseconds(15)));
  EXPECT_FALSE(decision.admitted);
  EXPECT_EQ(decision.reason, RejectReason::kTpot);
  // Only sequences the router does not know of would have to finish.
  EXPECT_EQ(decision.retry_after, KnownModelOptions().default_retry_after);
}

TEST(AdmissionControllerTest, ProtectsTheTighterTpotOfSequencesAlreadyAdmitted) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0", /*running=*/3));
  // Tight: 10 + 1 * 5 = 15 ms is its limit.
  ASSERT_TRUE(cluster.Admit(Request(100, 1000, absl::Seconds(5), absl::Milliseconds(15))).admitted);
  // Lax requests may share the batch only while the tight one keeps its TPOT.
  const AdmissionRequest lax = Request(100, 1000, absl::Seconds(5), absl::Milliseconds(100));
  EXPECT_TRUE(cluster.Admit(lax).admitted);  // Batch 5: 15 ms.
  const AdmissionDecision third = cluster.Admit(lax);
  EXPECT_FALSE(third.admitted);
  EXPECT_EQ(third.reason, RejectReason::kTpot);
}

TEST(AdmissionControllerTest, RejectsWhenNoDecodeWorkerHasKvBlocksForPromptAndOutput) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0", 0, /*kv_blocks_free=*/30, /*kv_blocks_total=*/30));
  // (100 + 100) tokens = 13 blocks of 16.
  const AdmissionRequest request = Request(100, 100, absl::Seconds(5), absl::Seconds(1));
  const AdmissionDecision first = cluster.Admit(request);
  ASSERT_TRUE(first.admitted);
  ASSERT_TRUE(cluster.Admit(request).admitted);
  AdmissionDecision third = cluster.Admit(request);
  ASSERT_FALSE(third.admitted);
  EXPECT_EQ(third.reason, RejectReason::kKvCapacity);
  EXPECT_GT(third.retry_after, absl::ZeroDuration());

  // The next report shows their prompt reservations (2 x 7 blocks); the rest
  // of their blocks are still counted, once.
  cluster.clock().Advance(absl::Milliseconds(1));
  cluster.Load(DecodeLoad("d0", 0, /*kv_blocks_free=*/16, /*kv_blocks_total=*/30));
  third = cluster.Admit(request);
  EXPECT_FALSE(third.admitted);
  EXPECT_EQ(third.reason, RejectReason::kKvCapacity);

  cluster.controller().Release(first.id);
  cluster.Load(DecodeLoad("d0", 0, /*kv_blocks_free=*/23, /*kv_blocks_total=*/30));
  EXPECT_TRUE(cluster.Admit(request).admitted);
}

TEST(AdmissionControllerTest, StaleAndDrainingWorkersAreNotCandidates) {
  AdmissionOptions options = KnownModelOptions();
  options.stale_after = absl::Seconds(2);
  Cluster cluster(options);
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d_stale"));  // Idle, the better choice if fresh.
  cluster.clock().Advance(absl::Seconds(3));
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d_busy", /*running=*/3));
  const AdmissionRequest request = Request(100, 10, absl::Seconds(5), absl::Seconds(1));

  AdmissionDecision decision = cluster.Admit(request);
  ASSERT_TRUE(decision.admitted);
  EXPECT_EQ(decision.decode_worker_id, "d_busy");

  WorkerLoadReport draining = DecodeLoad("d_busy", 3);
  draining.accepting = false;
  cluster.Load(draining);
  decision = cluster.Admit(request);
  ASSERT_FALSE(decision.admitted);
  EXPECT_EQ(decision.reason, RejectReason::kNoWorkers);
  EXPECT_EQ(RejectReasonName(decision.reason), "no_workers");
  EXPECT_GT(decision.retry_after, absl::ZeroDuration());

  cluster.Load(DecodeLoad("d_stale"));  // Fresh again.
  decision = cluster.Admit(request);
  ASSERT_TRUE(decision.admitted);
  EXPECT_EQ(decision.decode_worker_id, "d_stale");

  cluster.controller().RemoveWorker("d_stale");
  EXPECT_EQ(cluster.Admit(request).reason, RejectReason::kNoWorkers);
}

QosConfig GoldAndBronze() {
  QosConfig qos;
  QosClass gold;
  gold.name = "gold";
  gold.reserved_fraction = 0.5;
  QosClass bronze;
  bronze.name = "bronze";
  bronze.is_default = true;
  qos.classes = {gold, bronze};
  qos.default_index = 1;
  return qos;
}

TEST(AdmissionControllerTest, ClassMayNotUseKvBlocksReservedForOthers) {
  Cluster cluster(KnownModelOptions(), GoldAndBronze());
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0", 0, /*kv_blocks_free=*/100, /*kv_blocks_total=*/100));
  // 13 blocks each; gold reserves 50 of 100.
  AdmissionRequest bronze = Request(100, 100, absl::Seconds(5), absl::Seconds(1));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cluster.Admit(bronze).admitted) << i;
  const AdmissionDecision fourth = cluster.Admit(bronze);  // 52 > 50 unreserved.
  ASSERT_FALSE(fourth.admitted);
  EXPECT_EQ(fourth.reason, RejectReason::kClassCapacity);
  EXPECT_EQ(RejectReasonName(fourth.reason), "class_capacity");
  EXPECT_GT(fourth.retry_after, absl::ZeroDuration());

  AdmissionRequest gold = bronze;
  gold.qos_class = "gold";
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(cluster.Admit(gold).admitted) << i;  // 91 blocks.
  const AdmissionDecision gold_full = cluster.Admit(gold);
  ASSERT_FALSE(gold_full.admitted);
  EXPECT_EQ(gold_full.reason, RejectReason::kKvCapacity);
}

TEST(AdmissionControllerTest, ClassMayNotUsePrefillQueueReservedForOthers) {
  AdmissionOptions options = KnownModelOptions();
  options.prefill_queue_capacity_tokens = 10000;
  Cluster cluster(options, GoldAndBronze());
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  AdmissionRequest bronze = Request(3000, 10, absl::Seconds(60), absl::Seconds(1));
  ASSERT_TRUE(cluster.Admit(bronze).admitted);
  const AdmissionDecision second = cluster.Admit(bronze);  // 6000 > 5000 unreserved.
  ASSERT_FALSE(second.admitted);
  EXPECT_EQ(second.reason, RejectReason::kClassCapacity);
  // Waiting for 1000 tokens to drain at 10,000 tokens/s.
  EXPECT_NEAR(absl::ToDoubleSeconds(second.retry_after), 0.1, 1e-6);
  AdmissionRequest gold = bronze;
  gold.qos_class = "gold";
  EXPECT_TRUE(cluster.Admit(gold).admitted);
  EXPECT_TRUE(cluster.Admit(gold).admitted);
  // 12,000 tokens would exceed the queue itself: reported as a TTFT failure.
  const AdmissionDecision full = cluster.Admit(gold);
  ASSERT_FALSE(full.admitted);
  EXPECT_EQ(full.reason, RejectReason::kTtft);
}

TEST(AdmissionControllerTest, AdmissionOffAdmitsToTheLeastLoadedPair) {
  AdmissionOptions options = KnownModelOptions();
  options.enabled = false;
  Cluster cluster(options);
  cluster.Load(PrefillLoad("p0", /*queued_tokens=*/50000));
  cluster.Load(PrefillLoad("p1", /*queued_tokens=*/40000));
  cluster.Load(DecodeLoad("d0", /*running=*/40, /*kv_blocks_free=*/0));
  cluster.Load(DecodeLoad("d1", /*running=*/30, /*kv_blocks_free=*/0));
  const AdmissionRequest request =
      Request(1000, 100, absl::Milliseconds(100), absl::Milliseconds(12));
  for (int i = 0; i < 5; ++i) {
    const AdmissionDecision decision = cluster.Admit(request);
    ASSERT_TRUE(decision.admitted) << i;
    EXPECT_EQ(decision.decode_worker_id, "d1");
    EXPECT_EQ(decision.prefill_worker_id, "p1");
  }
  EXPECT_EQ(cluster.controller().num_in_flight(), 5);
}

TEST(AdmissionControllerTest, NoWorkersRejectsEvenWhenOff) {
  AdmissionOptions options = KnownModelOptions();
  options.enabled = false;
  Cluster cluster(options);
  cluster.Load(PrefillLoad("p0"));
  const AdmissionDecision decision =
      cluster.Admit(Request(10, 10, absl::Seconds(1), absl::Seconds(1)));
  EXPECT_FALSE(decision.admitted);
  EXPECT_EQ(decision.reason, RejectReason::kNoWorkers);
}

// A migrating request is admitted whatever the predictions, never to a
// worker it excludes, and refused only when no worker is left.
TEST(AdmissionControllerTest, AMigratingRequestIsAdmittedAwayFromItsFailedWorkers) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0", /*queued_tokens=*/50000));
  cluster.Load(PrefillLoad("p1", /*queued_tokens=*/40000));
  cluster.Load(DecodeLoad("d0", /*running=*/40));
  cluster.Load(DecodeLoad("d1", /*running=*/30));
  AdmissionRequest request = Request(1000, 100, absl::Milliseconds(100), absl::Milliseconds(12));
  EXPECT_FALSE(cluster.Admit(request).admitted);  // over both targets
  request.must_admit = true;
  request.excluded_workers = {"d1", "p1"};
  const AdmissionDecision decision = cluster.Admit(request);
  ASSERT_TRUE(decision.admitted);
  EXPECT_EQ(decision.decode_worker_id, "d0");
  EXPECT_EQ(decision.prefill_worker_id, "p0");
  request.excluded_workers = {"d0", "d1"};
  const AdmissionDecision none = cluster.Admit(request);
  EXPECT_FALSE(none.admitted);
  EXPECT_EQ(none.reason, RejectReason::kNoWorkers);
}

TEST(AdmissionControllerTest, ColocatedPairSkipsTheTransfer) {
  AdmissionOptions options = KnownModelOptions();
  options.transfer_model.bytes_per_token = 1'000'000;  // 1000 tokens: 0.1 s at 10 GB/s.
  options.transfer_model.fixed_latency = absl::ZeroDuration();
  Cluster cluster(options);
  WorkerLoadReport both = DecodeLoad("both0");
  both.role = WorkerRole::kBoth;
  cluster.Load(both);
  cluster.Load(PrefillLoad("p0"));
  const AdmissionDecision decision =
      cluster.Admit(Request(1000, 10, absl::Seconds(5), absl::Seconds(1)));
  ASSERT_TRUE(decision.admitted);
  EXPECT_EQ(decision.decode_worker_id, "both0");
  EXPECT_EQ(decision.prefill_worker_id, "both0");
  EXPECT_NEAR(absl::ToDoubleSeconds(decision.predicted_ttft), 0.110, 1e-9);
}

// A worker without a KV transport (role both, no UCX) is paired with itself
// alone, even where another worker would prefill sooner; with admission off
// too.
TEST(AdmissionControllerTest, AColocatedOnlyWorkerIsPairedWithItselfAlone) {
  for (const bool enabled : {true, false}) {
    SCOPED_TRACE(enabled ? "admission on" : "admission off");
    AdmissionOptions options = KnownModelOptions();
    options.enabled = enabled;
    Cluster cluster(options);
    WorkerLoadReport both = DecodeLoad("both0");
    both.role = WorkerRole::kBoth;
    both.queued_prefill_tokens = 4000;  // 0.4 s of prefill ahead of the request
    both.colocated_only = true;
    cluster.Load(both);
    cluster.Load(PrefillLoad("p0"));  // idle, and would prefill in 0.11 s
    const AdmissionDecision decision =
        cluster.Admit(Request(1000, 10, absl::Seconds(5), absl::Seconds(1)));
    ASSERT_TRUE(decision.admitted);
    EXPECT_EQ(decision.decode_worker_id, "both0");
    EXPECT_EQ(decision.prefill_worker_id, "both0");
    if (enabled) {
      EXPECT_GT(absl::ToDoubleSeconds(decision.predicted_ttft), 0.5);
    }

    // A second, transport-capable decode worker takes p0's prompts instead.
    cluster.Load(DecodeLoad("d1", /*running=*/5));
    both.running_sequences = 40;
    both.batch_context_tokens = 40000;
    cluster.Load(both);
    const AdmissionDecision other =
        cluster.Admit(Request(1000, 10, absl::Seconds(5), absl::Seconds(1)));
    ASSERT_TRUE(other.admitted);
    EXPECT_EQ(other.decode_worker_id, "d1");
    EXPECT_EQ(other.prefill_worker_id, "p0");
  }
}

TEST(AdmissionControllerTest, LearnsFromObservations) {
  Cluster cluster{AdmissionOptions()};  // Default priors.
  cluster.Load(PrefillLoad("p0"));
  for (int i = 1; i <= 200; ++i) {
    const int64_t tokens = 100 * (1 + i % 40);
    cluster.controller().ObservePrefill("p0", tokens, absl::Seconds(0.02 + 1e-5 * tokens));
  }
  WorkerLoadReport decode = DecodeLoad("d0");
  for (int i = 1; i <= 200; ++i) {
    decode.running_sequences = 1 + i % 40;
    decode.batch_context_tokens = 100 * decode.running_sequences * (1 + i % 23);
    decode.decode_step_time = absl::Seconds(0.005 + 0.0005 * decode.running_sequences +
                                            1e-7 * decode.batch_context_tokens);
    cluster.Load(decode);
  }
  const absl::optional<WorkerModelSnapshot> p0 = cluster.controller().ModelsOf("p0");
  const absl::optional<WorkerModelSnapshot> d0 = cluster.controller().ModelsOf("d0");
  ASSERT_TRUE(p0.has_value() && d0.has_value());
  EXPECT_NEAR(p0->prefill_fixed_seconds, 0.02, 0.002);
  EXPECT_NEAR(p0->prefill_seconds_per_token, 1e-5, 1e-7);
  EXPECT_NEAR(d0->decode_fixed_seconds, 0.005, 0.0005);
  EXPECT_NEAR(d0->decode_seconds_per_sequence, 0.0005, 0.00005);
  EXPECT_NEAR(d0->decode_seconds_per_context_token, 1e-7, 1e-8);
  EXPECT_FALSE(cluster.controller().ModelsOf("nobody").has_value());

  cluster.controller().ObserveTransfer(1'000'000'000, absl::Milliseconds(41));
  EXPECT_GT(cluster.controller().transfer_gigabytes_per_second(), 10);
}

TEST(AdmissionControllerTest, ReleaseIsIdempotentAndStaleIdsAreIgnored) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  const AdmissionRequest request = Request(100, 10, absl::Seconds(5), absl::Seconds(1));
  const AdmissionId first = cluster.Admit(request).id;
  cluster.controller().Release(first);
  cluster.controller().Release(first);
  EXPECT_EQ(cluster.controller().num_in_flight(), 0);
  const AdmissionId second = cluster.Admit(request).id;  // Reuses the slot.
  EXPECT_NE(first, second);
  cluster.controller().Release(first);  // Stale: must not release `second`.
  cluster.controller().MarkPrefillDone(first);
  EXPECT_EQ(cluster.controller().num_in_flight(), 1);
  cluster.controller().Release(second);
  EXPECT_EQ(cluster.controller().num_in_flight(), 0);
}

TEST(AdmissionControllerTest, InvalidRequestsAndReportsAreInvalidArgument) {
  Cluster cluster;
  EXPECT_THAT(cluster.controller().Admit(Request(0, 10, absl::Seconds(1), absl::Seconds(1))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("prompt_tokens")));
  EXPECT_THAT(cluster.controller().Admit(Request(10, 0, absl::Seconds(1), absl::Seconds(1))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_output_tokens")));
  EXPECT_THAT(cluster.controller().Admit(Request(10, 10, absl::ZeroDuration(), absl::Seconds(1))),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ttft")));
  AdmissionRequest unknown = Request(10, 10, absl::Seconds(1), absl::Seconds(1));
  unknown.qos_class = "platinum";
  EXPECT_THAT(cluster.controller().Admit(unknown),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("platinum")));
  WorkerLoadReport bad = DecodeLoad("d0", 0, /*kv_blocks_free=*/11, /*kv_blocks_total=*/10);
  EXPECT_THAT(cluster.controller().UpdateLoad(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("d0")));
  EXPECT_THAT(cluster.controller().UpdateLoad(WorkerLoadReport()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("worker_id")));
}

TEST(AdmissionControllerTest, SloMarginLeavesHeadroom) {
  AdmissionOptions options = KnownModelOptions();
  options.slo_margin = 0.9;
  Cluster cluster(options);
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  // Predicted TTFT 110 ms: within 120 ms but not within 0.9 * 120 = 108 ms.
  AdmissionDecision decision =
      cluster.Admit(Request(1000, 10, absl::Milliseconds(120), absl::Seconds(1)));
  EXPECT_FALSE(decision.admitted);
  EXPECT_EQ(decision.reason, RejectReason::kTtft);
  // 2 ms of backlog to drain, raised to the minimum retry delay.
  EXPECT_EQ(decision.retry_after, options.min_retry_after);
  // Predicted TPOT 11 ms: not within 0.9 * 12 ms.
  decision = cluster.Admit(Request(100, 10, absl::Seconds(1), absl::Milliseconds(12)));
  EXPECT_FALSE(decision.admitted);
  EXPECT_EQ(decision.reason, RejectReason::kTpot);
  EXPECT_TRUE(cluster.Admit(Request(100, 10, absl::Seconds(1), absl::Milliseconds(13))).admitted);
}

TEST(AdmissionControllerTest, ClassDefaultsApplyWhenTheRequestLeavesTargetsUnset) {
  QosConfig qos = QosConfig::SingleDefaultClass();
  qos.classes[0].default_ttft = absl::Milliseconds(100);
  Cluster cluster(KnownModelOptions(), qos);
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  AdmissionRequest request;
  request.prompt_tokens = 1000;  // 110 ms > the class's 100 ms.
  request.max_output_tokens = 10;
  EXPECT_EQ(cluster.Admit(request).reason, RejectReason::kTtft);
  request.ttft = absl::Milliseconds(200);  // The request's own target wins.
  EXPECT_TRUE(cluster.Admit(request).admitted);
}

TEST(AdmissionControllerTest, PrefillBacklogCountsAdmittedPromptsTheReportsDoNotShow) {
  // A worker that prefills its whole queue in one step reports an empty
  // queue at almost every sample; what this router sent it still counts.
  Cluster cluster;
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  const AdmissionDecision first =
      cluster.Admit(Request(1000, 10, absl::Seconds(10), absl::Seconds(1)));
  ASSERT_TRUE(first.admitted);
  EXPECT_NEAR(absl::ToDoubleSeconds(first.predicted_ttft), 0.110, 1e-9);
  cluster.Load(PrefillLoad("p0"));  // Sampled after the admission: still empty.
  const AdmissionDecision second =
      cluster.Admit(Request(1000, 10, absl::Seconds(10), absl::Seconds(1)));
  ASSERT_TRUE(second.admitted);
  // Behind the first prompt's 110 ms.
  EXPECT_NEAR(absl::ToDoubleSeconds(second.predicted_ttft), 0.220, 1e-9);

  // The first is done 50 ms later: the second is computed from then on.
  cluster.clock().Advance(absl::Milliseconds(50));
  cluster.controller().MarkPrefillDone(first.id);
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  const AdmissionDecision third =
      cluster.Admit(Request(100, 10, absl::Seconds(10), absl::Seconds(1)));
  ASSERT_TRUE(third.admitted);
  // 110 ms for the second, then 10 ms + 100 / 10,000 s.
  EXPECT_NEAR(absl::ToDoubleSeconds(third.predicted_ttft), 0.130, 1e-9);
}

TEST(AdmissionControllerTest, OutcomesScalePredictionsUntilTheyAgeOut) {
  AdmissionOptions options = KnownModelOptions();
  options.calibration_max_age = absl::Seconds(10);
  Cluster cluster(options);
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  const AdmissionDecision first =
      cluster.Admit(Request(100, 10, absl::Seconds(1), absl::Seconds(1)));
  ASSERT_TRUE(first.admitted);
  EXPECT_NEAR(absl::ToDoubleSeconds(first.predicted_ttft), 0.020, 1e-9);
  EXPECT_NEAR(absl::ToDoubleSeconds(first.predicted_tpot), 0.011, 1e-9);
  // Twice the predicted TTFT, three times the predicted TPOT.
  cluster.controller().MarkPrefillDone(first.id);
  cluster.controller().ObserveTtft(first.id, absl::Milliseconds(40));
  cluster.controller().ObserveTtft(first.id, absl::Milliseconds(400));  // Second call: ignored.
  cluster.controller().ObserveTpot(first.id, absl::Milliseconds(33));
  cluster.controller().Release(first.id);
  EXPECT_NEAR(cluster.controller().ModelsOf("p0")->ttft_scale, 2, 1e-9);
  EXPECT_NEAR(cluster.controller().ModelsOf("d0")->tpot_scale, 3, 1e-9);

  AdmissionDecision next = cluster.Admit(Request(100, 10, absl::Seconds(1), absl::Seconds(1)));
  ASSERT_TRUE(next.admitted);
  EXPECT_NEAR(absl::ToDoubleSeconds(next.predicted_ttft), 0.040, 1e-9);
  EXPECT_NEAR(absl::ToDoubleSeconds(next.predicted_tpot), 0.033, 1e-9);
  cluster.controller().MarkPrefillDone(next.id);
  cluster.controller().Release(next.id);
  // A TPOT target the calibrated prediction misses is rejected.
  EXPECT_EQ(cluster.Admit(Request(100, 10, absl::Seconds(1), absl::Milliseconds(30))).reason,
            RejectReason::kTpot);

  // Older than calibration_max_age: forgotten.
  cluster.clock().Advance(absl::Seconds(11));
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  EXPECT_NEAR(cluster.controller().ModelsOf("p0")->ttft_scale, 1, 1e-9);
  next = cluster.Admit(Request(100, 10, absl::Seconds(1), absl::Milliseconds(30)));
  ASSERT_TRUE(next.admitted);
  EXPECT_NEAR(absl::ToDoubleSeconds(next.predicted_ttft), 0.020, 1e-9);
  EXPECT_NEAR(absl::ToDoubleSeconds(next.predicted_tpot), 0.011, 1e-9);
}

TEST(AdmissionControllerTest, ALearnedTtftOverheadAgesOutWithItsOutcomes) {
  // Outcomes 150 ms over their predictions, whatever the prompt (a burst's
  // contention, say): learned as a fixed overhead.
  AdmissionOptions options = KnownModelOptions();
  options.calibration_max_age = absl::Seconds(10);
  Cluster cluster(options);
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  for (int i = 0; i < 10; ++i) {
    const int64_t prompt = 100 + 400 * i;
    const AdmissionDecision d =
        cluster.Admit(Request(prompt, 10, absl::Seconds(10), absl::Seconds(1)));
    ASSERT_TRUE(d.admitted) << i;
    cluster.controller().MarkPrefillDone(d.id);
    const double forecast = 0.010 + static_cast<double>(prompt) / 10000;
    cluster.controller().ObserveTtft(d.id, absl::Seconds(forecast + 0.150));
    cluster.controller().Release(d.id);
  }
  EXPECT_NEAR(absl::ToDoubleSeconds(cluster.controller().ModelsOf("p0")->ttft_overhead), 0.150,
              1e-6);
  EXPECT_NEAR(cluster.controller().ModelsOf("p0")->ttft_scale, 1, 1e-6);
  const AdmissionDecision during =
      cluster.Admit(Request(100, 10, absl::Milliseconds(100), absl::Seconds(1)));
  EXPECT_EQ(during.reason, RejectReason::kTtft);
  EXPECT_NEAR(absl::ToDoubleSeconds(during.predicted_ttft), 0.170, 1e-6);

  // Nothing admitted since, so no outcome to correct it: once its outcomes
  // are older than calibration_max_age, so is the overhead.
  cluster.clock().Advance(absl::Seconds(11));
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  EXPECT_EQ(cluster.controller().ModelsOf("p0")->ttft_overhead, absl::ZeroDuration());
  const AdmissionDecision after =
      cluster.Admit(Request(100, 10, absl::Milliseconds(100), absl::Seconds(1)));
  ASSERT_TRUE(after.admitted);
  EXPECT_NEAR(absl::ToDoubleSeconds(after.predicted_ttft), 0.020, 1e-9);
}

TEST(AdmissionControllerTest, PromptsBehindAQueueTeachAFactorNotAnOverhead) {
  // The same outcomes as ALearnedTtftOverheadAgesOutWithItsOutcomes (150 ms
  // over each prediction), but each prompt found 20 ms of queue ahead of
  // it: what the queue's forecast missed is no fixed cost of the worker.
  Cluster cluster;
  cluster.Load(DecodeLoad("d0"));
  for (int i = 0; i < 10; ++i) {
    cluster.Load(PrefillLoad("p0", /*queued_tokens=*/100, /*waiting=*/1));
    const int64_t prompt = 100 + 500 * i;
    const AdmissionDecision d =
        cluster.Admit(Request(prompt, 10, absl::Seconds(10), absl::Seconds(1)));
    ASSERT_TRUE(d.admitted) << i;
    cluster.controller().MarkPrefillDone(d.id);
    const double forecast = 0.020 + 0.010 + static_cast<double>(prompt) / 10000;
    cluster.controller().ObserveTtft(d.id, absl::Seconds(forecast + 0.150));
    cluster.controller().Release(d.id);
  }
  EXPECT_EQ(cluster.controller().ModelsOf("p0")->ttft_overhead, absl::ZeroDuration());
  EXPECT_GT(cluster.controller().ModelsOf("p0")->ttft_scale, 1.1);
}

AdmissionOptions ProbingOptions() {
  AdmissionOptions options = KnownModelOptions();
  options.idle_probe_interval = absl::Seconds(1);
  return options;
}

TEST(IdleProbeTest, AnIdlePairTakesARequestItsPredictionsRejectOncePerInterval) {
  Cluster cluster(ProbingOptions());
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  // Predicted 20 ms against a 10 ms target: a probe.
  const AdmissionRequest tight = Request(100, 10, absl::Milliseconds(10), absl::Seconds(1));
  const AdmissionDecision probe = cluster.Admit(tight);
  ASSERT_TRUE(probe.admitted);
  EXPECT_TRUE(probe.probe);
  EXPECT_EQ(probe.prefill_worker_id, "p0");
  EXPECT_EQ(probe.decode_worker_id, "d0");
  EXPECT_NEAR(absl::ToDoubleSeconds(probe.predicted_ttft), 0.020, 1e-9);
  EXPECT_EQ(probe.retry_after, absl::ZeroDuration());
  // While it is in flight the pair is not idle.
  EXPECT_EQ(cluster.Admit(tight).reason, RejectReason::kTtft);
  cluster.controller().MarkPrefillDone(probe.id);
  cluster.controller().Release(probe.id);
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  // Idle again, but within the interval.
  cluster.clock().Advance(absl::Milliseconds(500));
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  EXPECT_FALSE(cluster.Admit(tight).admitted);
  cluster.clock().Advance(absl::Milliseconds(500));
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  const AdmissionDecision next = cluster.Admit(tight);
  ASSERT_TRUE(next.admitted);
  EXPECT_TRUE(next.probe);
  // A request its predictions admit is no probe.
  cluster.controller().MarkPrefillDone(next.id);
  cluster.controller().Release(next.id);
  const AdmissionDecision plain =
      cluster.Admit(Request(100, 10, absl::Seconds(1), absl::Seconds(1)));
  ASSERT_TRUE(plain.admitted);
  EXPECT_FALSE(plain.probe);
}

TEST(IdleProbeTest, ABusyWorkerOrAFullKvCacheIsNeverProbed) {
  Cluster cluster(ProbingOptions());
  const AdmissionRequest tight = Request(100, 10, absl::Milliseconds(10), absl::Seconds(1));
  // A queue on the prefill worker.
  cluster.Load(PrefillLoad("p0", /*queued_tokens=*/1000, /*waiting=*/1));
  cluster.Load(DecodeLoad("d0"));
  EXPECT_EQ(cluster.Admit(tight).reason, RejectReason::kTtft);
  // A batch on the decode worker.
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0", /*running=*/1));
  EXPECT_EQ(cluster.Admit(tight).reason, RejectReason::kTtft);
  // No room for the request's KV: a capacity rejection, not a prediction.
  cluster.Load(DecodeLoad("d0", /*running=*/0, /*kv_blocks_free=*/0));
  EXPECT_EQ(cluster.Admit(tight).reason, RejectReason::kKvCapacity);
  cluster.Load(DecodeLoad("d0"));
  EXPECT_TRUE(cluster.Admit(tight).probe);
}

TEST(IdleProbeTest, ADecodeModelFittedToABurstDoesNotShutOutTheIdleCluster) {
  // A burst: steps of 40 ms at batch 20, the only samples the decode model
  // has. At batch 1 it still predicts more than a 15 ms TPOT target.
  for (const bool probes : {false, true}) {
    AdmissionOptions options = KnownModelOptions();
    if (probes) options.idle_probe_interval = absl::Seconds(1);
    Cluster cluster(options);
    cluster.Load(PrefillLoad("p0"));
    WorkerLoadReport burst = DecodeLoad("d0", /*running=*/20);
    burst.decode_step_time = absl::Milliseconds(40);
    for (int i = 0; i < 100; ++i) cluster.Load(burst);
    cluster.clock().Advance(absl::Seconds(60));
    cluster.Load(PrefillLoad("p0"));
    cluster.Load(DecodeLoad("d0"));
    const AdmissionDecision d =
        cluster.Admit(Request(100, 10, absl::Seconds(1), absl::Milliseconds(15)));
    EXPECT_GT(absl::ToDoubleSeconds(d.predicted_tpot), 0.015) << probes;
    if (!probes) {
      EXPECT_EQ(d.reason, RejectReason::kTpot);
      continue;
    }
    ASSERT_TRUE(d.admitted && d.probe);
    // The probe decodes alone: the reports' steps at batch 1 take 3 ms.
    cluster.controller().MarkPrefillDone(d.id);
    WorkerLoadReport alone = DecodeLoad("d0", /*running=*/1);
    alone.decode_step_time = absl::Milliseconds(3);
    for (int i = 0; i < 3; ++i) cluster.Load(alone);
    cluster.controller().Release(d.id);
    cluster.Load(DecodeLoad("d0"));
    // Within the probe interval, admitted on its predictions.
    const AdmissionDecision next =
        cluster.Admit(Request(100, 10, absl::Seconds(1), absl::Milliseconds(15)));
    ASSERT_TRUE(next.admitted);
    EXPECT_FALSE(next.probe);
    EXPECT_LT(absl::ToDoubleSeconds(next.predicted_tpot), 0.015);
  }
}

TEST(AdmissionControllerTest, APromptWaitingPastItsPredictionRaisesTtftPredictions) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  const AdmissionDecision first =
      cluster.Admit(Request(100, 10, absl::Seconds(1), absl::Seconds(1)));
  ASSERT_TRUE(first.admitted);  // Predicted 20 ms.
  // Still waiting 60 ms later: the worker runs at a third of its model.
  cluster.clock().Advance(absl::Milliseconds(60));
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  const AdmissionDecision second =
      cluster.Admit(Request(100, 10, absl::Seconds(1), absl::Seconds(1)));
  ASSERT_TRUE(second.admitted);
  // The first's modelled work is over; 20 ms for this one, times 3.
  EXPECT_NEAR(absl::ToDoubleSeconds(second.predicted_ttft), 0.060, 1e-9);
  EXPECT_NEAR(cluster.controller().ModelsOf("p0")->ttft_scale, 1, 1e-9);  // No outcomes yet.
}

TEST(AdmissionControllerTest, ASlowedWorkerHasDoneLessOfItsBacklogThanTheClockSays) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  // One outcome: the worker runs at half its model's rate.
  const AdmissionDecision probe =
      cluster.Admit(Request(100, 10, absl::Seconds(10), absl::Seconds(1)));
  ASSERT_TRUE(probe.admitted);  // Predicted 20 ms.
  cluster.controller().MarkPrefillDone(probe.id);
  cluster.controller().ObserveTtft(probe.id, absl::Milliseconds(40));
  cluster.controller().Release(probe.id);
  EXPECT_NEAR(cluster.controller().ModelsOf("p0")->ttft_scale, 2, 1e-6);

  const AdmissionDecision first =
      cluster.Admit(Request(1000, 10, absl::Seconds(10), absl::Seconds(1)));
  ASSERT_TRUE(first.admitted);
  EXPECT_NEAR(absl::ToDoubleSeconds(first.predicted_ttft), 0.220, 1e-6);  // 2 x 110 ms.
  // 110 ms later the model would have it done; at half speed, half of it is.
  cluster.clock().Advance(absl::Milliseconds(110));
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d0"));
  const AdmissionDecision second =
      cluster.Admit(Request(100, 10, absl::Seconds(10), absl::Seconds(1)));
  ASSERT_TRUE(second.admitted);
  // 110 ms left of the first, then 2 x 20 ms: not 2 x (0 + 20 ms).
  EXPECT_NEAR(absl::ToDoubleSeconds(second.predicted_ttft), 0.150, 1e-6);
  // A target between the two is rejected.
  EXPECT_EQ(cluster.Admit(Request(100, 10, absl::Milliseconds(100), absl::Seconds(1))).reason,
            RejectReason::kTtft);

  // The first's outcome at exactly half speed keeps the scale at 2.
  cluster.clock().Advance(absl::Milliseconds(110));
  cluster.controller().MarkPrefillDone(first.id);
  cluster.controller().ObserveTtft(first.id, absl::Milliseconds(220));
  EXPECT_NEAR(cluster.controller().ModelsOf("p0")->ttft_scale, 2, 1e-5);
}

}  // namespace
}  // namespace trident::router::admission

namespace trident::router::admission {
namespace {

// KV-aware routing: a prefill worker is priced for the prompt tokens its
// cache lacks.
TEST(AdmissionPrefixTest, ARepeatedPrefixGoesToTheWorkerHoldingIt) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(PrefillLoad("p1"));
  cluster.Load(DecodeLoad("d"));
  AdmissionRequest request = Request(4096, 16, absl::Milliseconds(2000), absl::Milliseconds(200));
  request.cached_tokens = {{"p1", 4000}};
  const AdmissionDecision decision = cluster.Admit(request);
  ASSERT_TRUE(decision.admitted);
  EXPECT_EQ(decision.prefill_worker_id, "p1");
  EXPECT_EQ(decision.predicted_cached_tokens, 4000);
  // 10 ms + 96 tokens at 10k/s, not 10 ms + 4096 at 10k/s.
  EXPECT_NEAR(absl::ToDoubleMilliseconds(decision.predicted_ttft), 10 + 9.6, 0.5);
  // A whole prompt cached still computes its last token.
  request.cached_tokens = {{"p0", 4096}};
  const AdmissionDecision full = cluster.Admit(request);
  EXPECT_EQ(full.prefill_worker_id, "p0");
  EXPECT_EQ(full.predicted_cached_tokens, 4095);
}

// The decode worker reserves only what its cache lacks: the KV transfer is
// priced at those tokens.
TEST(AdmissionPrefixTest, TheTransferIsPricedAtWhatTheDecodeWorkerLacks) {
  AdmissionOptions options = KnownModelOptions();
  options.transfer_model.bytes_per_token = 1'000'000;  // 1000 tokens: 0.1 s at 10 GB/s.
  options.transfer_model.fixed_latency = absl::ZeroDuration();
  Cluster cluster(options);
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(DecodeLoad("d"));
  AdmissionRequest request = Request(4096, 16, absl::Milliseconds(5000), absl::Milliseconds(200));
  const AdmissionDecision cold = cluster.Admit(request);
  ASSERT_TRUE(cold.admitted);
  cluster.controller().Release(cold.id);
  request.cached_tokens = {{"d", 4000}};
  const AdmissionDecision warm = cluster.Admit(request);
  ASSERT_TRUE(warm.admitted);
  // 4096 tokens moved (409.6 ms) against 96 (9.6 ms); the prefill worker
  // computes the whole prompt either way.
  EXPECT_NEAR(absl::ToDoubleMilliseconds(cold.predicted_ttft - warm.predicted_ttft), 400, 1);
  EXPECT_EQ(warm.predicted_cached_tokens, 0);
}

// One hot prefix held by one worker: requests go there while its queue is
// shorter than the prefill they save, then spread to the other worker; the
// queue is charged only the uncached tokens.
TEST(AdmissionPrefixTest, AHotPrefixSpreadsOnceItsHoldersQueueOutweighsTheSaving) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(PrefillLoad("p1"));
  cluster.Load(DecodeLoad("d"));
  AdmissionRequest request = Request(2048, 16, absl::Seconds(30), absl::Seconds(1));
  request.cached_tokens = {{"p1", 2000}};
  int on_holder = 0, elsewhere = 0;
  for (int i = 0; i < 40; ++i) {
    const AdmissionDecision d = cluster.Admit(request);
    ASSERT_TRUE(d.admitted);
    (d.prefill_worker_id == "p1" ? on_holder : elsewhere) += 1;
  }
  std::printf("40 requests sharing a prefix cached on p1: %d on p1, %d on p0\n", on_holder,
              elsewhere);
  // Each costs p1 14.8 ms (10 + 48 tokens) and p0 214.8 ms: p0 takes one
  // whenever p1's queue has grown past ~200 ms of work.
  EXPECT_GT(on_holder, elsewhere);
  EXPECT_GE(elsewhere, 2);
}

// What a worker's DRAM tier would bring is priced as cached: of two idle
// prefill workers, the one whose store holds the prefix wins, and the
// transfer is priced by the decode worker's own cache alone.
TEST(AdmissionPrefixTest, ADramTierHitIsPricedAsCachedForItsWorker) {
  Cluster cluster;
  cluster.Load(PrefillLoad("p0"));
  cluster.Load(PrefillLoad("p1"));
  cluster.Load(DecodeLoad("d"));
  AdmissionRequest request = Request(2048, 16, absl::Seconds(30), absl::Seconds(1));
  const AdmissionDecision cold = cluster.Admit(request);
  ASSERT_TRUE(cold.admitted);
  cluster.controller().Release(cold.id);
  request.dram_cached_tokens = {{"p1", 1000}};
  for (int i = 0; i < 3; ++i) {
    const AdmissionDecision d = cluster.Admit(request);
    ASSERT_TRUE(d.admitted);
    EXPECT_EQ(d.prefill_worker_id, "p1") << i;
    EXPECT_LT(d.predicted_ttft, cold.predicted_ttft) << i;
    cluster.controller().Release(d.id);
  }
}

}  // namespace
}  // namespace trident::router::admission
