// The role policy driving a simulated cluster (fake_cluster.h) on a fake
// clock, one policy interval at a time, with seeded noise: the acceptance
// cases of the controller's policy.
//
//   (a) traffic shifts from prompt-heavy to generation-heavy: prefill
//       workers move to decode within a bound, then stay;
//   (b) noisy steady load for 1,000 intervals: no flip, although single
//       samples cross the threshold (and a policy without the window and the
//       sustain count flips on that same noise);
//   (c) Prometheus down, or a series missing, while the load calls for a
//       flip: every interval holds with the reason, and the flip comes only
//       after the metrics return and the need is sustained again.

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/controller/policy/fake_cluster.h"
#include "services/controller/policy/role_policy.h"
#include "services/controller/policy/signal_reader.h"
#include "services/controller/prometheus/fake_metrics_source.h"

namespace trident::controller {
namespace {

using ::testing::HasSubstr;
using trident::v1::ROLE_DECODE;
using trident::v1::ROLE_PREFILL;

constexpr uint64_t kSeed = 20240607;

// Long prompts, short answers: prefill-bound.
constexpr Traffic kPromptHeavy{
    .requests_per_second = 6, .prompt_tokens = 3000, .output_tokens = 60};
// Short prompts, long answers: decode-bound.
constexpr Traffic kGenerationHeavy{
    .requests_per_second = 6, .prompt_tokens = 300, .output_tokens = 600};
// A chat-like mix that a 2:2 cluster serves inside the band.
constexpr Traffic kSteady{.requests_per_second = 6, .prompt_tokens = 1000, .output_tokens = 300};

struct Flip {
  int interval;
  Decision decision;
  std::string roles_after;
};

// Runs `intervals` intervals from the cluster's current state; applies every
// flip. `first_interval` numbers them.
std::vector<Flip> RunIntervals(FakeCluster& cluster, RolePolicy& policy, int first_interval,
                               int intervals) {
  std::vector<Flip> flips;
  for (int i = first_interval; i < first_interval + intervals; ++i) {
    cluster.Step();
    const Decision decision = policy.Decide(cluster.Observe());
    if (decision.action != Decision::Action::kFlip) continue;
    EXPECT_TRUE(cluster.Apply(decision).ok()) << DecisionToString(decision);
    flips.push_back({i, decision, cluster.RolesString()});
  }
  return flips;
}

void PrintFlips(const std::vector<Flip>& flips) {
  for (const Flip& f : flips) {
    std::printf("  interval %3d: %s -> roles %s\n", f.interval,
                DecisionToString(f.decision).c_str(), f.roles_after.c_str());
  }
}

TEST(RolePolicySimulationTest, ShiftToGenerationHeavyTrafficMovesRolesWithinBound) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  FakeClock clock(absl::FromUnixSeconds(1'700'000'000));
  const RolePolicyOptions options;  // The controller's defaults.
  const FakeClusterOptions cluster_options;
  RolePolicy policy = *RolePolicy::Create(options, &clock);
  FakeCluster cluster(cluster_options, {ROLE_PREFILL, ROLE_PREFILL, ROLE_PREFILL, ROLE_DECODE},
                      kSeed, &clock);

  cluster.set_traffic(kPromptHeavy);
  const std::vector<Flip> before = RunIntervals(cluster, policy, -100, 100);
  std::printf("prompt-heavy, 100 intervals: %zu flips, roles %s, last decision: %s\n",
              before.size(), cluster.RolesString().c_str(),
              DecisionToString(policy.Decide(cluster.Observe())).c_str());
  EXPECT_TRUE(before.empty());

  cluster.set_traffic(kGenerationHeavy);
  const std::vector<Flip> flips = RunIntervals(cluster, policy, 1, 300);
  std::printf("generation-heavy from interval 1: %zu flips\n", flips.size());
  PrintFlips(flips);

  // Two flips: 3P+1D to 1P+3D. The first once the forecast crosses
  // high_pressure, which holds once the window has only post-shift samples
  // (window_intervals), plus sustain_intervals - 1; every later one needs
  // the previous flip to complete (flip_intervals), min_samples fresh
  // samples and the need sustained: flip_intervals + min_samples +
  // sustain_intervals - 2 after it. The last worker serves its new role
  // flip_intervals after its order.
  ASSERT_EQ(flips.size(), 2u);
  const int num_flips = static_cast<int>(flips.size());
  const int bound = options.window_intervals + options.sustain_intervals - 1 +
                    (num_flips - 1) * (cluster_options.flip_intervals + options.min_samples +
                                       options.sustain_intervals - 2) +
                    cluster_options.flip_intervals;
  const int n = flips.back().interval + cluster_options.flip_intervals;
  std::printf("N = %d intervals from the shift until the roles moved (bound %d)\n", n, bound);
  EXPECT_LE(n, bound);
  for (const Flip& f : flips) {
    EXPECT_EQ(f.decision.from, ROLE_PREFILL);
    EXPECT_EQ(f.decision.to, ROLE_DECODE);
    EXPECT_EQ(f.decision.reason, DecisionReason::kDecodePressure);
  }
  EXPECT_EQ(cluster.Count(ROLE_PREFILL), 1);
  EXPECT_EQ(cluster.Count(ROLE_DECODE), 3);

  // The new split serves the traffic: decode pressure back under the band's
  // top on average over the last 50 intervals, and no more flips.
  double decode_sum = 0;
  int samples = 0;
  for (int i = 0; i < 50; ++i) {
    cluster.Step();
    const Decision d = policy.Decide(cluster.Observe());
    EXPECT_EQ(d.action, Decision::Action::kHold) << DecisionToString(d);
    decode_sum += d.decode.observed;
    ++samples;
  }
  std::printf("after: roles %s, mean decode pressure %.2f\n", cluster.RolesString().c_str(),
              decode_sum / samples);
  EXPECT_LT(decode_sum / samples, options.high_pressure);
}

TEST(RolePolicySimulationTest, NoisySteadyLoadFlipsNothingIn1000Intervals) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  FakeClock clock(absl::FromUnixSeconds(1'700'000'000));
  const RolePolicyOptions options;
  RolePolicy policy = *RolePolicy::Create(options, &clock);
  FakeCluster cluster(FakeClusterOptions{}, {ROLE_PREFILL, ROLE_PREFILL, ROLE_DECODE, ROLE_DECODE},
                      kSeed, &clock);
  cluster.set_traffic(kSteady);

  int flips = 0;
  int raw_crossings = 0;
  double max_forecast[2] = {0, 0};
  double sum[2] = {0, 0};
  std::map<std::string, int> reasons;
  for (int i = 0; i < 1000; ++i) {
    cluster.Step();
    const Decision d = policy.Decide(cluster.Observe());
    ++reasons[std::string(DecisionReasonName(d.reason))];
    if (d.action == Decision::Action::kFlip) {
      ++flips;
      std::printf("  unexpected: interval %d: %s\n", i, DecisionToString(d).c_str());
      ASSERT_TRUE(cluster.Apply(d).ok());
    }
    const RolePressure* roles[2] = {&d.prefill, &d.decode};
    for (int r = 0; r < 2; ++r) {
      sum[r] += roles[r]->observed;
      if (roles[r]->observed >= options.high_pressure) ++raw_crossings;
      if (!std::isnan(roles[r]->forecast))
        max_forecast[r] = std::max(max_forecast[r], roles[r]->forecast);
    }
  }
  std::printf("1000 intervals, roles %s: %d flips\n", cluster.RolesString().c_str(), flips);
  std::printf(
      "  mean pressure prefill %.2f decode %.2f; highest forecast prefill %.2f decode %.2f "
      "(high_pressure %.2f)\n",
      sum[0] / 1000, sum[1] / 1000, max_forecast[0], max_forecast[1], options.high_pressure);
  std::printf("  single samples at or above high_pressure: %d\n", raw_crossings);
  for (const auto& [reason, count] : reasons) std::printf("  %-12s %d\n", reason.c_str(), count);
  EXPECT_EQ(flips, 0);
  // The noise is real: single samples did cross the threshold.
  EXPECT_GT(raw_crossings, 0);

  // And with other seeds, and a slightly heavier load.
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    FakeClock seed_clock(absl::FromUnixSeconds(1'700'000'000));
    RolePolicy seed_policy = *RolePolicy::Create(options, &seed_clock);
    FakeCluster seed_cluster(FakeClusterOptions{},
                             {ROLE_PREFILL, ROLE_PREFILL, ROLE_DECODE, ROLE_DECODE}, seed,
                             &seed_clock);
    Traffic heavier = kSteady;
    heavier.requests_per_second = 6.2;
    seed_cluster.set_traffic(heavier);
    const std::vector<Flip> seed_flips = RunIntervals(seed_cluster, seed_policy, 0, 1000);
    std::printf("  seed %2llu, 6.2 requests/s: %zu flips\n", static_cast<unsigned long long>(seed),
                seed_flips.size());
    PrintFlips(seed_flips);
    EXPECT_TRUE(seed_flips.empty()) << "seed " << seed;
  }

  // The same noise, with no window (smoothing 1, horizon 0, one sample) and
  // no sustain: the policy flips on a lone sample.
  RolePolicyOptions naive = options;
  naive.window_intervals = 1;
  naive.min_samples = 1;
  naive.smoothing = 1;
  naive.horizon_intervals = 0;
  naive.sustain_intervals = 1;
  FakeClock naive_clock(absl::FromUnixSeconds(1'700'000'000));
  RolePolicy naive_policy = *RolePolicy::Create(naive, &naive_clock);
  FakeCluster naive_cluster(FakeClusterOptions{},
                            {ROLE_PREFILL, ROLE_PREFILL, ROLE_DECODE, ROLE_DECODE}, kSeed,
                            &naive_clock);
  naive_cluster.set_traffic(kSteady);
  const std::vector<Flip> naive_flips = RunIntervals(naive_cluster, naive_policy, 0, 1000);
  std::printf("without the window and the sustain count: %zu flips\n", naive_flips.size());
  PrintFlips(naive_flips);
  EXPECT_GT(naive_flips.size(), 0u);
}

// (c): the policy's caller, as the controller runs it: signals read from a
// MetricsSource (here the fake, fed from the simulated cluster's signals
// under the default queries' texts), then Decide.
class MetricsFeed {
 public:
  MetricsFeed(const Clock* clock, const SignalQueries& queries)
      : source_(clock, "prometheus at http://prometheus.test:9090"), queries_(queries) {}

  // Publishes `cluster`'s signals as the router's series would carry them.
  void Publish(const FakeCluster& cluster, const Observation& observation) {
    const ClusterSignals& s = cluster.signals();
    const double requests = 6;
    for (const WorkerState& w : observation.workers) {
      if (!w.serving) continue;
      const bool prefill = w.role == ROLE_PREFILL;
      source_.Set(queries_.queued_prefill_tokens_by_worker,
                  prefill ? s.prefill.queued_prefill_tokens / cluster.Count(ROLE_PREFILL) : 0,
                  {{"worker", w.worker_id}});
      source_.Set(queries_.kv_usage_ratio_by_worker, prefill ? 0 : s.decode.kv_usage_ratio,
                  {{"worker", w.worker_id}});
    }
    source_.Set(queries_.prefill_tokens_per_second_per_worker,
                s.prefill.prefill_tokens_per_second_per_worker);
    source_.Set(queries_.ttft_p90_seconds, s.prefill.ttft_p90_seconds);
    source_.Set(queries_.tpot_p90_seconds, s.decode.tpot_p90_seconds);
    source_.Set(queries_.requests_per_second, requests);
    source_.Set(queries_.ttft_rejections_per_second, s.prefill.ttft_rejected_ratio * requests);
    source_.Set(queries_.decode_rejections_per_second, s.decode.rejected_ratio * requests);
    source_.Set(queries_.decode_waiting_sequences, s.decode.waiting_sequences);
  }

  FakeMetricsSource& source() { return source_; }

 private:
  FakeMetricsSource source_;
  const SignalQueries queries_;
};

TEST(RolePolicySimulationTest, PrometheusDownOrSeriesMissingHoldsWithTheReason) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  FakeClock clock(absl::FromUnixSeconds(1'700'000'000));
  const RolePolicyOptions options;
  RolePolicy policy = *RolePolicy::Create(options, &clock);
  FakeCluster cluster(FakeClusterOptions{}, {ROLE_PREFILL, ROLE_PREFILL, ROLE_PREFILL, ROLE_DECODE},
                      kSeed, &clock);
  const SignalQueries queries = DefaultSignalQueries();
  MetricsFeed feed(&clock, queries);
  cluster.set_traffic(kGenerationHeavy);  // Calls for decode workers from the start.

  int interval = 0;
  auto step = [&](const char* phase) {
    cluster.Step();
    Observation observation = cluster.Observe();
    feed.Publish(cluster, observation);
    observation.signals = ReadClusterSignals(feed.source(), observation.workers, queries);
    const Decision d = policy.Decide(observation);
    std::printf("  %-18s interval %2d: %s\n", phase, ++interval, DecisionToString(d).c_str());
    if (d.action == Decision::Action::kFlip) {
      EXPECT_TRUE(cluster.Apply(d).ok());
    }
    return d;
  };

  // Two intervals of good metrics: the policy warms up toward a flip.
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(step("metrics").action, Decision::Action::kHold);
  }
  feed.source().SetError(absl::UnavailableError(
      "prometheus at http://prometheus.test:9090: query `...`: unreachable: Couldn't connect"));
  for (int i = 0; i < 8; ++i) {
    const Decision d = step("prometheus down");
    EXPECT_EQ(d.action, Decision::Action::kHold);
    EXPECT_EQ(d.reason, DecisionReason::kMetricsUnavailable);
    EXPECT_THAT(d.detail, HasSubstr("http://prometheus.test:9090"));
  }
  feed.source().SetError(absl::OkStatus());
  for (int i = 0; i < 5; ++i) {
    cluster.Step();
    Observation observation = cluster.Observe();
    feed.Publish(cluster, observation);
    // The routers' KV usage series vanish (e.g. they are no longer scraped).
    feed.source().Remove(queries.kv_usage_ratio_by_worker);
    observation.signals = ReadClusterSignals(feed.source(), observation.workers, queries);
    const Decision d = policy.Decide(observation);
    std::printf("  %-18s interval %2d: %s\n", "series missing", ++interval,
                DecisionToString(d).c_str());
    EXPECT_EQ(d.action, Decision::Action::kHold);
    EXPECT_EQ(d.reason, DecisionReason::kSeriesMissing);
    EXPECT_THAT(d.detail, HasSubstr("trident_router_worker_kv_usage_ratio"));
  }
  EXPECT_EQ(cluster.Count(ROLE_DECODE), 1) << "no flip while the metrics were missing";

  // Metrics back: the need must be sustained again before the flip.
  int holds_before_flip = 0;
  Decision d;
  do {
    d = step("metrics back");
    if (d.action == Decision::Action::kHold) ++holds_before_flip;
  } while (d.action == Decision::Action::kHold && holds_before_flip < 20);
  EXPECT_EQ(d.action, Decision::Action::kFlip);
  EXPECT_EQ(d.to, ROLE_DECODE);
  // The samples from before the outage aged out of the window: min_samples
  // fresh ones, then the need sustained.
  EXPECT_GE(holds_before_flip, options.min_samples + options.sustain_intervals - 2);
}

}  // namespace
}  // namespace trident::controller
