// The worker's engine metrics (trident_worker_*), fed by the engine's stats
// after every iteration (engine::Engine::SetStatsObserver). They are the
// vLLM-equivalent set the dashboards chart:
//
//   trident_worker_num_requests_running             gauge     requests in the running batch
//   trident_worker_num_requests_waiting             gauge     requests waiting to be scheduled
//   trident_worker_kv_cache_usage_ratio             gauge     KV blocks in use / blocks in the pool
//   trident_worker_kv_cache_blocks                  gauge     KV blocks in the pool
//   trident_worker_kv_cache_cached_blocks           gauge     cached blocks nobody holds
//                                                             (evictable; free for
//                                                             kv_cache_usage_ratio)
//   trident_worker_prefix_cache_queries_total       counter   prompt tokens looked up in the prefix
//                                                             cache, once per request at admission
//   trident_worker_prefix_cache_hits_total{tier}    counter   of those, tokens found cached: tier
//                                                             "gpu" in this worker's pool, "dram"
//                                                             fetched from an attention service's
//                                                             block store for the request; hit rate
//                                                             = rate(hits) / rate(queries)
//   trident_worker_kv_transfer_cached_blocks_total  counter   blocks of prompts reserved for a
//                                                             prefill worker's KV that this
//                                                             worker's prefix cache held already
//                                                             (not sent)
//   trident_worker_kv_invariant_failures_total      counter   idle checks of the block pool's books
//                                                             that found them broken (a bug)
//   trident_worker_prompt_tokens_total              counter   prompt tokens accepted
//   trident_worker_generation_tokens_total          counter   tokens generated
//   trident_worker_preemptions_total                counter   sequences preempted for KV blocks
//   trident_worker_engine_steps_total               counter   forward passes
//   trident_worker_step_seconds_total               counter   their durations (scheduling, the
//                                                             forward pass, sampling), summed:
//                                                             against wall time, the share of it
//                                                             the loop spent stepping
//   trident_worker_backlogged_steps_total           counter   of those, steps whose prompt chunks
//                                                             took the backlog's raised cap
//   trident_worker_token_delivery_batches_total     counter   steps' token batches handed to the
//                                                             engine's delivery thread
//   trident_worker_token_delivery_lag_seconds_total counter   their time queued before their
//                                                             callbacks began, summed
//   trident_worker_iteration_tokens                 histogram tokens per forward pass (batch size
//                                                             in tokens), one observation a step
//   trident_worker_iteration_decode_sequences       histogram one-token decode sequences per step,
//                                                             for steps that had any
//   trident_worker_cpu_attention_sequences          gauge     sequences whose attention runs at a
//                                                             CPU attention service
//   trident_worker_cpu_attention_tokens             gauge     their KV tokens
//   trident_worker_offload_decisions_total{decision} counter  moved, held (a guard refused),
//                                                             failed, dropped (background copy
//                                                             outlived its sequence), demoted
//   trident_worker_step_hook_seconds_total          counter   loop time in the step hook before
//                                                             steps (offload moves), all waiting
//   trident_worker_decode_step_seconds              histogram duration of decode-only steps
//   trident_worker_mixed_step_seconds               histogram duration of steps that ran prompt
//                                                             tokens beside decode sequences
//   trident_worker_pipelined_steps_total            counter   steps run as two sub-batches
//   trident_worker_cpu_attention_seconds_total      counter   CPU attention round trips, summed
//   trident_worker_cpu_attention_exposed_seconds_total counter of those, the time steps waited
//   trident_worker_cpu_attention_hidden_ratio       gauge     share hidden, over the last step
//                                                             that had any

#ifndef TRIDENT_SERVICES_WORKER_ENGINE_METRICS_H_
#define TRIDENT_SERVICES_WORKER_ENGINE_METRICS_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "common/engine/engine_core.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace trident::worker {

// Buckets of trident_worker_iteration_tokens: powers of two, 1 to 16384
// (--max_batch_tokens defaults to 2048).
std::vector<double> IterationTokensBuckets();
// Buckets of trident_worker_iteration_decode_sequences: powers of two, 1 to
// 1024 (--max_running defaults to 256).
std::vector<double> IterationDecodeSequencesBuckets();
// Buckets of trident_worker_decode_step_seconds and
// trident_worker_mixed_step_seconds: 1 ms to ~1 s.
std::vector<double> DecodeStepSecondsBuckets();

// Thread-compatible: Update runs on the engine's loop thread only (the
// prometheus-cpp metrics themselves are thread-safe to scrape).
class EngineMetrics {
 public:
  // Registers every family in `registry`, which must outlive this.
  explicit EngineMetrics(prometheus::Registry& registry);

  EngineMetrics(const EngineMetrics&) = delete;
  EngineMetrics& operator=(const EngineMetrics&) = delete;

  // Brings the metrics up to `stats`: gauges take its values, counters grow
  // by its totals' increase since the previous call, and the iteration
  // histograms observe the last step when `stats.steps_total` advanced.
  void Update(const engine::EngineStats& stats);
  // Tokens of a request's cache hit that the KV tier fetched from DRAM for
  // it (counted as tier "dram", not "gpu"). Thread-safe.
  void AddDramHits(int64_t tokens);

 private:
  prometheus::Gauge& running_;
  prometheus::Gauge& waiting_;
  prometheus::Gauge& kv_usage_;
  prometheus::Gauge& kv_blocks_;
  prometheus::Gauge& kv_cached_blocks_;
  prometheus::Counter& prefix_queries_;
  prometheus::Counter& prefix_hits_gpu_;
  prometheus::Counter& prefix_hits_dram_;
  // DRAM hits not yet taken out of the engine's hits (which count them).
  std::atomic<int64_t> dram_pending_{0};
  prometheus::Counter& kv_invariant_failures_;
  prometheus::Counter& kv_transfer_cached_blocks_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generated_tokens_;
  prometheus::Counter& preemptions_;
  prometheus::Counter& steps_;
  prometheus::Counter& step_seconds_;
  prometheus::Counter& backlogged_steps_;
  prometheus::Counter& delivery_batches_;
  prometheus::Counter& delivery_lag_;
  prometheus::Histogram& iteration_tokens_;
  prometheus::Histogram& iteration_decode_sequences_;
  prometheus::Gauge& cpu_sequences_;
  prometheus::Gauge& cpu_tokens_;
  prometheus::Family<prometheus::Counter>& offload_family_;
  prometheus::Counter& offload_moved_;
  prometheus::Counter& offload_placed_;
  prometheus::Counter& offload_held_;
  prometheus::Counter& offload_failed_;
  prometheus::Counter& offload_dropped_;
  prometheus::Counter& offload_demoted_;
  prometheus::Family<prometheus::Counter>& offload_tokens_family_;
  prometheus::Counter& offload_in_place_tokens_;
  prometheus::Counter& offload_copied_tokens_;
  prometheus::Counter& step_hook_;
  prometheus::Histogram& decode_step_;
  prometheus::Histogram& mixed_step_;
  prometheus::Counter& pipelined_steps_;
  prometheus::Counter& cpu_round_trip_;
  prometheus::Counter& cpu_exposed_;
  prometheus::Gauge& cpu_hidden_;
  prometheus::Gauge& cpu_cost_scale_;
  prometheus::Gauge& graphs_;
  prometheus::Counter& graph_replays_;
  prometheus::Counter& graph_misses_;
  // The stats of the previous Update.
  engine::EngineStats last_;
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_ENGINE_METRICS_H_
