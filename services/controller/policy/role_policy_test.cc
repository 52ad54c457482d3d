#include "services/controller/policy/role_policy.h"

#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::controller {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::StatusIs;
using trident::v1::Role;
using trident::v1::ROLE_BOTH;
using trident::v1::ROLE_DECODE;
using trident::v1::ROLE_PREFILL;

constexpr absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

// Workers w0, w1, ... in `roles`, last changed an hour before kStart.
std::vector<WorkerState> Workers(const std::vector<Role>& roles) {
  std::vector<WorkerState> workers;
  for (size_t i = 0; i < roles.size(); ++i) {
    workers.push_back(WorkerState{.worker_id = absl::StrCat("w", i),
                                  .role = roles[i],
                                  .role_change_time = kStart - absl::Hours(1)});
  }
  return workers;
}

// Signals whose pressures are exactly `prefill` and `decode` under the
// default options (TTFT and TPOT at that share of their SLOs).
Observation At(double prefill, double decode, std::vector<WorkerState> workers) {
  ClusterSignals signals;
  signals.prefill.ttft_p90_seconds = prefill * 0.5;
  signals.decode.tpot_p90_seconds = decode * 0.05;
  return Observation{.signals = signals, .workers = std::move(workers)};
}

// Runs the policy once per interval on `observation`, returning the reasons.
std::vector<DecisionReason> Intervals(RolePolicy& policy, FakeClock& clock,
                                      const Observation& observation, int n,
                                      Decision* last = nullptr) {
  std::vector<DecisionReason> reasons;
  for (int i = 0; i < n; ++i) {
    clock.Advance(policy.options().interval);
    const Decision d = policy.Decide(observation);
    std::printf("    %s\n", DecisionToString(d).c_str());
    reasons.push_back(d.reason);
    if (last != nullptr) *last = d;
  }
  return reasons;
}

TEST(RolePressureTest, EachPrefillComponentCanDominate) {
  const RolePolicyOptions o;
  PrefillSignals s;
  s.ttft_p90_seconds = 0.25;
  RolePressure p = PrefillPressure(s, 2, o);
  EXPECT_DOUBLE_EQ(p.observed, 0.5);
  EXPECT_EQ(p.dominant, "ttft_p90");
  EXPECT_EQ(p.workers, 2);

  // 6000 queued tokens over 2 workers of 10000 tokens/s: 0.3 s, of 0.5 s.
  s.queued_prefill_tokens = 6000;
  s.prefill_tokens_per_second_per_worker = 10000;
  p = PrefillPressure(s, 2, o);
  EXPECT_DOUBLE_EQ(p.observed, 0.6);
  EXPECT_EQ(p.dominant, "prefill_queue");

  s.ttft_rejected_ratio = 0.04;  // Of 0.05.
  p = PrefillPressure(s, 2, o);
  EXPECT_DOUBLE_EQ(p.observed, 0.8);
  EXPECT_EQ(p.dominant, "ttft_rejections");

  s.ttft_p90_seconds = INFINITY;
  EXPECT_DOUBLE_EQ(PrefillPressure(s, 2, o).observed, o.max_pressure);
  // No prefill worker and work queued: the most pressure there is.
  EXPECT_DOUBLE_EQ(PrefillPressure(PrefillSignals{.queued_prefill_tokens = 1,
                                                  .prefill_tokens_per_second_per_worker = 1000},
                                   0, o)
                       .observed,
                   o.max_pressure);
}

TEST(RolePressureTest, EachDecodeComponentCanDominateAndNanIsLeftOut) {
  const RolePolicyOptions o;
  DecodeSignals s;
  RolePressure p = DecodePressure(s, 2, o);
  EXPECT_EQ(p.observed, 0);
  EXPECT_EQ(p.dominant, "decode_waiting");  // 0 waiting is a signal; NaN TPOT and KV are not.

  s.kv_usage_ratio = 0.45;
  EXPECT_EQ(DecodePressure(s, 2, o).dominant, "kv_usage");
  EXPECT_DOUBLE_EQ(DecodePressure(s, 2, o).observed, 0.5);
  s.waiting_sequences = 6;  // 6 / (2 workers * 4).
  EXPECT_EQ(DecodePressure(s, 2, o).dominant, "decode_waiting");
  EXPECT_DOUBLE_EQ(DecodePressure(s, 2, o).observed, 0.75);
  s.tpot_p90_seconds = 0.045;
  EXPECT_EQ(DecodePressure(s, 2, o).dominant, "tpot_p90");
  EXPECT_DOUBLE_EQ(DecodePressure(s, 2, o).observed, 0.9);
  s.rejected_ratio = 0.5;
  EXPECT_EQ(DecodePressure(s, 2, o).dominant, "decode_rejections");
  EXPECT_DOUBLE_EQ(DecodePressure(s, 2, o).observed, o.max_pressure);
}

TEST(RolePolicyTest, WarmsUpThenHoldsInsideTheBand) {
  FakeClock clock(kStart);
  RolePolicy policy = *RolePolicy::Create({}, &clock);
  EXPECT_THAT(Intervals(policy, clock, At(0.85, 0.8, Workers({ROLE_PREFILL, ROLE_DECODE})), 4),
              ::testing::ElementsAre(DecisionReason::kWarmingUp, DecisionReason::kWarmingUp,
                                     DecisionReason::kBalanced, DecisionReason::kBalanced));
}

TEST(RolePolicyTest, FlipsOnceTheNeedIsSustainedAndPicksTheLeastBusyWorker) {
  FakeClock clock(kStart);
  RolePolicy policy = *RolePolicy::Create({}, &clock);
  std::vector<WorkerState> workers =
      Workers({ROLE_PREFILL, ROLE_PREFILL, ROLE_PREFILL, ROLE_DECODE});
  workers[0].load = 5;
  workers[1].load = 1;
  workers[2].load = 1;
  workers[2].role_change_time -= absl::Hours(1);  // Longest in its role of the least busy.
  Decision last;
  EXPECT_THAT(Intervals(policy, clock, At(0.2, 1.5, workers), 5, &last),
              ::testing::ElementsAre(DecisionReason::kWarmingUp, DecisionReason::kWarmingUp,
                                     DecisionReason::kSustaining, DecisionReason::kSustaining,
                                     DecisionReason::kDecodePressure));
  EXPECT_EQ(last.action, Decision::Action::kFlip);
  EXPECT_EQ(last.worker_id, "w2");
  EXPECT_EQ(last.from, ROLE_PREFILL);
  EXPECT_EQ(last.to, ROLE_DECODE);
  EXPECT_DOUBLE_EQ(last.decode.forecast, 1.5);
  EXPECT_EQ(last.decode.dominant, "tpot_p90");
}

TEST(RolePolicyTest, FlipsDecodeToPrefillWhenPrefillNeedsAWorker) {
  FakeClock clock(kStart);
  RolePolicy policy = *RolePolicy::Create({}, &clock);
  Decision last;
  Intervals(policy, clock, At(1.2, 0.3, Workers({ROLE_PREFILL, ROLE_DECODE, ROLE_DECODE})), 5,
            &last);
  EXPECT_EQ(last.action, Decision::Action::kFlip);
  EXPECT_EQ(last.reason, DecisionReason::kPrefillPressure);
  EXPECT_EQ(last.from, ROLE_DECODE);
  EXPECT_EQ(last.to, ROLE_PREFILL);
}

TEST(RolePolicyTest, NeverTakesTheLastWorkerOfARole) {
  FakeClock clock(kStart);
  RolePolicy policy = *RolePolicy::Create({}, &clock);
  // Decode is far past its SLO; the one prefill worker stays.
  Decision last;
  const std::vector<DecisionReason> reasons =
      Intervals(policy, clock, At(0.0, 2.0, Workers({ROLE_PREFILL, ROLE_DECODE})), 10, &last);
  EXPECT_EQ(reasons.back(), DecisionReason::kLastWorker);
  EXPECT_THAT(last.detail, HasSubstr("prefill has 1 serving worker"));
  EXPECT_THAT(reasons, ::testing::Not(::testing::Contains(DecisionReason::kDecodePressure)));
  // Workers in role both are not counted: still the last prefill worker.
  EXPECT_EQ(Intervals(policy, clock,
                      At(0.0, 2.0, Workers({ROLE_PREFILL, ROLE_DECODE, ROLE_BOTH, ROLE_BOTH})), 5)
                .back(),
            DecisionReason::kLastWorker);
}

TEST(RolePolicyTest, HoldsWhenTheGiverWouldBeTooBusy) {
  FakeClock clock(kStart);
  RolePolicy policy = *RolePolicy::Create({}, &clock);
  // Prefill at 0.5 on 2 workers would be at 1.0 on one: no headroom.
  Decision last;
  Intervals(policy, clock, At(0.5, 1.5, Workers({ROLE_PREFILL, ROLE_PREFILL, ROLE_DECODE})), 10,
            &last);
  EXPECT_EQ(last.reason, DecisionReason::kNoHeadroom);
  EXPECT_THAT(last.detail, HasSubstr("one worker fewer would be at 1.00 > 0.70"));
}

TEST(RolePolicyTest, NoNewActionWhileAFlipIsPending) {
  FakeClock clock(kStart);
  RolePolicy policy = *RolePolicy::Create({}, &clock);
  const std::vector<WorkerState> workers =
      Workers({ROLE_PREFILL, ROLE_PREFILL, ROLE_PREFILL, ROLE_DECODE});
  // One interval short of a flip.
  EXPECT_EQ(Intervals(policy, clock, At(0.1, 1.8, workers), 4).back(), DecisionReason::kSustaining);
  Observation pending = At(0.1, 1.8, workers);
  pending.flip_pending = true;
  for (DecisionReason reason : Intervals(policy, clock, pending, 3)) {
    EXPECT_EQ(reason, DecisionReason::kFlipPending);
  }
  // Pending over without a role change (e.g. the worker refused): the need
  // must be sustained anew.
  EXPECT_THAT(Intervals(policy, clock, At(0.1, 1.8, workers), 3),
              ::testing::ElementsAre(DecisionReason::kSustaining, DecisionReason::kSustaining,
                                     DecisionReason::kDecodePressure));
}

TEST(RolePolicyTest, AtMostOneFlipPerInterval) {
  FakeClock clock(kStart);
  RolePolicyOptions options;
  options.min_samples = 1;
  options.sustain_intervals = 1;
  RolePolicy policy = *RolePolicy::Create(options, &clock);
  const Observation hot =
      At(0.1, 1.8, Workers({ROLE_PREFILL, ROLE_PREFILL, ROLE_PREFILL, ROLE_DECODE}));
  clock.Advance(options.interval);
  EXPECT_EQ(policy.Decide(hot).action, Decision::Action::kFlip);
  // The caller asks again within the interval, before it reports anything.
  EXPECT_EQ(policy.Decide(hot).reason, DecisionReason::kOnePerInterval);
  clock.Advance(options.interval - absl::Seconds(1));
  const Decision again = policy.Decide(hot);
  EXPECT_EQ(again.reason, DecisionReason::kOnePerInterval);
  EXPECT_THAT(again.detail, HasSubstr("last flip 9s ago"));
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(policy.Decide(hot).action, Decision::Action::kFlip);
}

TEST(RolePolicyTest, KeepsAMinimumDwellPerWorker) {
  FakeClock clock(kStart + absl::Seconds(30));
  RolePolicy policy = *RolePolicy::Create({}, &clock);
  std::vector<WorkerState> workers =
      Workers({ROLE_PREFILL, ROLE_PREFILL, ROLE_PREFILL, ROLE_DECODE});
  // Every prefill worker changed role lately: w1 at kStart, the others 30 s
  // later.
  workers[0].role_change_time = kStart + absl::Seconds(30);
  workers[1].role_change_time = kStart;
  workers[2].role_change_time = kStart + absl::Seconds(30);
  Decision last;
  const std::vector<DecisionReason> reasons =
      Intervals(policy, clock, At(0.1, 1.8, workers), 9, &last);
  // Decisions at kStart + 40 s, 50 s, ...: the need is sustained at 80 s,
  // and holds for dwell until w1's 2 minutes end at 120 s.
  EXPECT_EQ(reasons[3], DecisionReason::kSustaining);
  EXPECT_EQ(reasons[4], DecisionReason::kDwell);
  EXPECT_EQ(reasons[7], DecisionReason::kDwell);
  EXPECT_EQ(reasons[8], DecisionReason::kDecodePressure);
  EXPECT_EQ(last.worker_id, "w1");
}

TEST(RolePolicyTest, MissingMetricsHoldWithTheirReasonAndBreakTheSustainedNeed) {
  FakeClock clock(kStart);
  RolePolicy policy = *RolePolicy::Create({}, &clock);
  const std::vector<WorkerState> workers =
      Workers({ROLE_PREFILL, ROLE_PREFILL, ROLE_PREFILL, ROLE_DECODE});
  EXPECT_EQ(Intervals(policy, clock, At(0.1, 1.8, workers), 4).back(), DecisionReason::kSustaining);

  Observation down{.signals = absl::UnavailableError("prometheus at http://p:9090: unreachable"),
                   .workers = workers};
  Decision last;
  EXPECT_EQ(Intervals(policy, clock, down, 1, &last).back(), DecisionReason::kMetricsUnavailable);
  EXPECT_EQ(last.action, Decision::Action::kHold);
  EXPECT_THAT(last.detail, HasSubstr("holding every role: prometheus at http://p:9090"));
  EXPECT_TRUE(std::isnan(last.decode.observed));
  EXPECT_TRUE(std::isnan(last.decode.forecast));
  EXPECT_EQ(last.decode.workers, 1);
  down.signals = absl::NotFoundError("query `x`: no series");
  EXPECT_EQ(Intervals(policy, clock, down, 1).back(), DecisionReason::kSeriesMissing);

  // Back: the window still holds recent samples, but the need starts over.
  EXPECT_EQ(Intervals(policy, clock, At(0.1, 1.8, workers), 1, &last).back(),
            DecisionReason::kSustaining);
  EXPECT_THAT(last.detail, HasSubstr("for 1 of 3 intervals"));
}

TEST(RolePolicyTest, MapsEachSignalErrorToItsReason) {
  FakeClock clock(kStart);
  RolePolicy policy = *RolePolicy::Create({}, &clock);
  Observation observation{.workers = Workers({ROLE_PREFILL, ROLE_DECODE})};
  const std::vector<std::pair<absl::Status, DecisionReason>> cases = {
      {absl::UnavailableError("down"), DecisionReason::kMetricsUnavailable},
      {absl::DeadlineExceededError("silent"), DecisionReason::kMetricsUnavailable},
      {absl::NotFoundError("no series"), DecisionReason::kSeriesMissing},
      {absl::InvalidArgumentError("bad_data"), DecisionReason::kMetricsError},
      {absl::InternalError("malformed"), DecisionReason::kMetricsError},
  };
  for (const auto& [status, reason] : cases) {
    observation.signals = status;
    EXPECT_EQ(Intervals(policy, clock, observation, 1).back(), reason) << status;
  }
}

TEST(RolePolicyTest, WindowRestartsWhenTheServingSetChanges) {
  FakeClock clock(kStart);
  RolePolicy policy = *RolePolicy::Create({}, &clock);
  std::vector<WorkerState> workers = Workers({ROLE_PREFILL, ROLE_PREFILL, ROLE_DECODE});
  EXPECT_EQ(Intervals(policy, clock, At(0.3, 0.5, workers), 3).back(), DecisionReason::kBalanced);
  workers.push_back(
      WorkerState{.worker_id = "w3", .role = ROLE_DECODE, .role_change_time = kStart});
  Decision last;
  EXPECT_EQ(Intervals(policy, clock, At(0.3, 0.5, workers), 1, &last).back(),
            DecisionReason::kWarmingUp);
  EXPECT_THAT(last.detail, HasSubstr("1 of 3 samples in the window"));
  workers[1].serving = false;  // Draining, e.g. for a flip.
  EXPECT_EQ(Intervals(policy, clock, At(0.3, 0.5, workers), 1, &last).back(),
            DecisionReason::kWarmingUp);
  EXPECT_EQ(last.prefill.workers, 1);
}

TEST(RolePolicyTest, NoWorkersToFlip) {
  FakeClock clock(kStart);
  RolePolicy policy = *RolePolicy::Create({}, &clock);
  EXPECT_EQ(Intervals(policy, clock, At(2, 2, Workers({ROLE_BOTH, ROLE_BOTH})), 1).back(),
            DecisionReason::kNoWorkers);
}

TEST(RolePolicyOptionsTest, RejectsOptionsOutOfRange) {
  EXPECT_THAT(ValidateRolePolicyOptions({}), StatusIs(absl::StatusCode::kOk));
  auto with = [](auto change) {
    RolePolicyOptions o;
    change(o);
    return ValidateRolePolicyOptions(o);
  };
  EXPECT_THAT(with([](auto& o) { o.interval = absl::ZeroDuration(); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("interval")));
  EXPECT_THAT(with([](auto& o) { o.min_samples = 7; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("min_samples")));
  EXPECT_THAT(with([](auto& o) { o.low_pressure = 0.9; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("low_pressure")));
  EXPECT_THAT(with([](auto& o) { o.high_pressure = 3; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_pressure")));
  EXPECT_THAT(with([](auto& o) { o.smoothing = 0; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("smoothing")));
  EXPECT_THAT(with([](auto& o) { o.sustain_intervals = 0; }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sustain")));
  EXPECT_THAT(with([](auto& o) { o.tpot_slo = absl::ZeroDuration(); }),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("slo")));
  FakeClock clock;
  EXPECT_THAT(RolePolicy::Create(RolePolicyOptions{.window_intervals = 0}, &clock),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(DecisionReasonTest, NamesAreDistinctSnakeCaseLabels) {
  std::set<std::string> names;
  for (int r = static_cast<int>(DecisionReason::kPrefillPressure);
       r <= static_cast<int>(DecisionReason::kDwell); ++r) {
    const std::string name(DecisionReasonName(static_cast<DecisionReason>(r)));
    EXPECT_THAT(name, ::testing::MatchesRegex("[a-z_]+"));
    EXPECT_NE(name, "unknown");
    names.insert(name);
  }
  EXPECT_EQ(names.size(), 14u);
}

}  // namespace
}  // namespace trident::controller
