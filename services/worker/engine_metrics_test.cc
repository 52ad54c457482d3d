#include "services/worker/engine_metrics.h"

#include <string>
#include <vector>

#include "common/engine/engine_core.h"
#include "common/telemetry/collected_series.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace trident::worker {
namespace {

using ::testing::DoubleEq;
using ::trident::telemetry::CollectedSeries;
using ::trident::telemetry::FindSeries;

// The cumulative count of bucket `le` of histogram `name` (no labels).
double BucketCount(prometheus::Registry& registry, const std::string& name, double le) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      for (const prometheus::ClientMetric::Bucket& b : m.histogram.bucket) {
        if (b.upper_bound == le) return static_cast<double>(b.cumulative_count);
      }
    }
  }
  ADD_FAILURE() << "no bucket le=" << le << " in " << name;
  return -1;
}

TEST(EngineMetricsTest, EverySeriesExistsAtZeroBeforeAnyStep) {
  prometheus::Registry registry;
  EngineMetrics metrics(registry);
  for (const std::string name :
       {"trident_worker_num_requests_running", "trident_worker_num_requests_waiting",
        "trident_worker_kv_cache_usage_ratio", "trident_worker_prompt_tokens_total",
        "trident_worker_generation_tokens_total", "trident_worker_engine_steps_total",
        "trident_worker_iteration_tokens", "trident_worker_iteration_decode_sequences",
        "trident_worker_backlogged_steps_total", "trident_worker_mixed_step_seconds"}) {
    const CollectedSeries s = FindSeries(registry, name, {});
    EXPECT_TRUE(s.found) << name;
    EXPECT_EQ(s.value, 0) << name;
    EXPECT_EQ(s.count, 0u) << name;
  }
}

TEST(EngineMetricsTest, IterationHistogramsObserveEachStepOnce) {
  prometheus::Registry registry;
  EngineMetrics metrics(registry);
  engine::EngineStats stats;
  // A prefill step of 100 prompt tokens.
  stats.steps_total = 1;
  stats.last_step_tokens = 100;
  stats.last_step_prefill_tokens = 100;
  stats.last_step_decode_sequences = 0;
  metrics.Update(stats);
  // An iteration that ran no step (same steps_total) observes nothing.
  metrics.Update(stats);
  // A decode step of 3 sequences, then one of 20 prompt tokens + 5 decodes.
  stats.steps_total = 2;
  stats.last_step_tokens = 3;
  stats.last_step_prefill_tokens = 0;
  stats.last_step_decode_sequences = 3;
  metrics.Update(stats);
  stats.steps_total = 3;
  stats.backlogged_steps_total = 1;
  stats.last_step_tokens = 25;
  stats.last_step_prefill_tokens = 20;
  stats.last_step_decode_sequences = 5;
  metrics.Update(stats);
  EXPECT_EQ(FindSeries(registry, "trident_worker_backlogged_steps_total", {}).value, 1);

  const CollectedSeries tokens = FindSeries(registry, "trident_worker_iteration_tokens", {});
  EXPECT_EQ(tokens.count, 3u);
  EXPECT_THAT(tokens.sum, DoubleEq(128));
  EXPECT_EQ(BucketCount(registry, "trident_worker_iteration_tokens", 4), 1);
  EXPECT_EQ(BucketCount(registry, "trident_worker_iteration_tokens", 32), 2);
  EXPECT_EQ(BucketCount(registry, "trident_worker_iteration_tokens", 128), 3);
  // The prefill-only step is not a decode batch.
  const CollectedSeries decodes =
      FindSeries(registry, "trident_worker_iteration_decode_sequences", {});
  EXPECT_EQ(decodes.count, 2u);
  EXPECT_THAT(decodes.sum, DoubleEq(8));
  EXPECT_EQ(BucketCount(registry, "trident_worker_iteration_decode_sequences", 4), 1);
  EXPECT_EQ(FindSeries(registry, "trident_worker_engine_steps_total", {}).value, 3);
}

TEST(EngineMetricsTest, GaugesFollowTheLatestStatsAndCountersTheirIncrease) {
  prometheus::Registry registry;
  EngineMetrics metrics(registry);
  engine::EngineStats stats;
  stats.running = 4;
  stats.waiting = 2;
  stats.blocks_total = 10;
  stats.blocks_free = 4;
  stats.prompt_tokens_total = 50;
  stats.generated_tokens_total = 7;
  metrics.Update(stats);
  stats.running = 1;
  stats.waiting = 0;
  stats.blocks_free = 9;
  stats.prompt_tokens_total = 60;
  stats.generated_tokens_total = 12;
  metrics.Update(stats);

  EXPECT_EQ(FindSeries(registry, "trident_worker_num_requests_running", {}).value, 1);
  EXPECT_EQ(FindSeries(registry, "trident_worker_num_requests_waiting", {}).value, 0);
  EXPECT_THAT(FindSeries(registry, "trident_worker_kv_cache_usage_ratio", {}).value, DoubleEq(0.1));
  EXPECT_EQ(FindSeries(registry, "trident_worker_prompt_tokens_total", {}).value, 60);
  EXPECT_EQ(FindSeries(registry, "trident_worker_generation_tokens_total", {}).value, 12);
}

TEST(EngineMetricsTest, GraphsAreAGaugeAndTheirReplaysAndMissesCounters) {
  prometheus::Registry registry;
  EngineMetrics metrics(registry);
  engine::EngineStats stats;
  stats.graphs = {.captured = 120, .capture_seconds = 1.5, .replays = 40, .misses = 1};
  metrics.Update(stats);
  stats.graphs.replays = 100;
  stats.graphs.misses = 3;
  metrics.Update(stats);
  EXPECT_EQ(FindSeries(registry, "trident_worker_cuda_graphs", {}).value, 120);
  EXPECT_EQ(FindSeries(registry, "trident_worker_cuda_graph_replays_total", {}).value, 100);
  EXPECT_EQ(FindSeries(registry, "trident_worker_cuda_graph_misses_total", {}).value, 3);
}

TEST(EngineMetricsTest, OffloadDecisionsHookTimeAndDecodeStepDurations) {
  prometheus::Registry registry;
  EngineMetrics metrics(registry);
  engine::EngineStats stats;
  // A decode-only step of 5 ms after 0.25 s of moves in the hook.
  stats.steps_total = 1;
  stats.last_step_tokens = 4;
  stats.last_step_decode_sequences = 4;
  stats.last_step_seconds = 0.005;
  stats.remote_moves_total = 2;
  stats.remote_placed_total = 1;
  stats.remote_held_total = 3;
  stats.remote_move_failures_total = 1;
  stats.remote_moves_dropped_total = 2;
  stats.step_hook_seconds_total = 0.25;
  stats.cpu_cost_scale = 1.7;
  stats.delivered_batches_total = 3;
  stats.delivery_lag_seconds_total = 0.002;
  metrics.Update(stats);
  // A mixed step (prompt tokens beside the decode sequences): not a decode
  // step.
  stats.steps_total = 2;
  stats.last_step_tokens = 104;
  stats.last_step_prefill_tokens = 100;
  stats.last_step_seconds = 0.3;
  stats.remote_held_total = 4;
  stats.step_hook_seconds_total = 0.5;
  stats.delivered_batches_total = 5;
  stats.delivery_lag_seconds_total = 0.003;
  metrics.Update(stats);

  const std::string decisions = "trident_worker_offload_decisions_total";
  EXPECT_EQ(FindSeries(registry, decisions, {{"decision", "moved"}}).value, 2);
  EXPECT_EQ(FindSeries(registry, decisions, {{"decision", "placed"}}).value, 1);
  EXPECT_EQ(FindSeries(registry, decisions, {{"decision", "held"}}).value, 4);
  EXPECT_EQ(FindSeries(registry, decisions, {{"decision", "failed"}}).value, 1);
  EXPECT_EQ(FindSeries(registry, decisions, {{"decision", "dropped"}}).value, 2);
  EXPECT_EQ(FindSeries(registry, decisions, {{"decision", "demoted"}}).value, 0);
  EXPECT_THAT(FindSeries(registry, "trident_worker_step_hook_seconds_total", {}).value,
              DoubleEq(0.5));
  EXPECT_EQ(FindSeries(registry, "trident_worker_token_delivery_batches_total", {}).value, 5);
  EXPECT_THAT(FindSeries(registry, "trident_worker_token_delivery_lag_seconds_total", {}).value,
              DoubleEq(0.003));
  EXPECT_THAT(FindSeries(registry, "trident_worker_offload_cpu_cost_scale", {}).value,
              DoubleEq(1.7));
  const CollectedSeries steps = FindSeries(registry, "trident_worker_decode_step_seconds", {});
  EXPECT_EQ(steps.count, 1u);
  EXPECT_THAT(steps.sum, DoubleEq(0.005));
  EXPECT_EQ(BucketCount(registry, "trident_worker_decode_step_seconds", 0.004), 0);
  EXPECT_EQ(BucketCount(registry, "trident_worker_decode_step_seconds", 0.006), 1);
  const CollectedSeries mixed = FindSeries(registry, "trident_worker_mixed_step_seconds", {});
  EXPECT_EQ(mixed.count, 1u);
  EXPECT_THAT(mixed.sum, DoubleEq(0.3));
  EXPECT_THAT(FindSeries(registry, "trident_worker_step_seconds_total", {}).value, DoubleEq(0.305));
  // A prefill-only step (no decode sequences) is neither.
  stats.steps_total = 3;
  stats.last_step_tokens = 100;
  stats.last_step_decode_sequences = 0;
  stats.last_step_seconds = 0.2;
  metrics.Update(stats);
  EXPECT_EQ(FindSeries(registry, "trident_worker_decode_step_seconds", {}).count, 1u);
  EXPECT_EQ(FindSeries(registry, "trident_worker_mixed_step_seconds", {}).count, 1u);
  EXPECT_THAT(FindSeries(registry, "trident_worker_step_seconds_total", {}).value, DoubleEq(0.505));
}

TEST(EngineMetricsTest, BucketsArePowersOfTwoCoveringTheDefaultLimits) {
  for (const std::vector<double>& buckets :
       {IterationTokensBuckets(), IterationDecodeSequencesBuckets()}) {
    ASSERT_FALSE(buckets.empty());
    EXPECT_EQ(buckets.front(), 1);
    for (size_t i = 1; i < buckets.size(); ++i) EXPECT_EQ(buckets[i], 2 * buckets[i - 1]);
  }
  EXPECT_GE(IterationTokensBuckets().back(), 2048);          // --max_batch_tokens.
  EXPECT_GE(IterationDecodeSequencesBuckets().back(), 256);  // --max_running.
}

}  // namespace
}  // namespace trident::worker
