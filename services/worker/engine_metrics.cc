#include "services/worker/engine_metrics.h"

#include <algorithm>

namespace trident::worker {
namespace {

std::vector<double> PowersOfTwo(double last) {
  std::vector<double> buckets;
  for (double b = 1; b <= last; b *= 2) buckets.push_back(b);
  return buckets;
}

}  // namespace

std::vector<double> IterationTokensBuckets() { return PowersOfTwo(16384); }

std::vector<double> IterationDecodeSequencesBuckets() { return PowersOfTwo(1024); }

std::vector<double> DecodeStepSecondsBuckets() {
  return {0.001, 0.002, 0.004, 0.006, 0.008, 0.012, 0.016, 0.024,
          0.032, 0.048, 0.064, 0.096, 0.128, 0.256, 0.512, 1.024};
}

EngineMetrics::EngineMetrics(prometheus::Registry& r)
    : running_(prometheus::BuildGauge()
                   .Name("trident_worker_num_requests_running")
                   .Help("Requests in the running batch.")
                   .Register(r)
                   .Add({})),
      waiting_(prometheus::BuildGauge()
                   .Name("trident_worker_num_requests_waiting")
                   .Help("Requests waiting to be scheduled (including preempted ones).")
                   .Register(r)
                   .Add({})),
      kv_usage_(prometheus::BuildGauge()
                    .Name("trident_worker_kv_cache_usage_ratio")
                    .Help("Fraction of KV cache blocks held by sequences (cached blocks nobody "
                          "holds count as free).")
                    .Register(r)
                    .Add({})),
      kv_blocks_(prometheus::BuildGauge()
                     .Name("trident_worker_kv_cache_blocks")
                     .Help("KV cache blocks in the pool.")
                     .Register(r)
                     .Add({})),
      kv_cached_blocks_(prometheus::BuildGauge()
                            .Name("trident_worker_kv_cache_cached_blocks")
                            .Help("Cached KV blocks no sequence holds: kept for prefix reuse, "
                                  "evicted (LRU) when the pool needs them.")
                            .Register(r)
                            .Add({})),
      prefix_queries_(prometheus::BuildCounter()
                          .Name("trident_worker_prefix_cache_queries_total")
                          .Help("Prompt tokens looked up in the prefix cache (once per request, "
                                "at admission).")
                          .Register(r)
                          .Add({})),
      prefix_hits_gpu_(prometheus::BuildCounter()
                           .Name("trident_worker_prefix_cache_hits_total")
                           .Help("Prompt tokens found in the prefix cache, by tier (gpu: this "
                                 "worker's KV pool).")
                           .Register(r)
                           .Add({{"tier", "gpu"}})),
      prefix_hits_dram_(prometheus::BuildCounter()
                            .Name("trident_worker_prefix_cache_hits_total")
                            .Help("Prompt tokens found in the prefix cache, by tier (gpu: this "
                                  "worker's KV pool).")
                            .Register(r)
                            .Add({{"tier", "dram"}})),
      kv_invariant_failures_(prometheus::BuildCounter()
                                 .Name("trident_worker_kv_invariant_failures_total")
                                 .Help("Idle checks of the KV block pool's books that found them "
                                       "broken (a bug; the log says which).")
                                 .Register(r)
                                 .Add({})),
      kv_transfer_cached_blocks_(
          prometheus::BuildCounter()
              .Name("trident_worker_kv_transfer_cached_blocks_total")
              .Help("Blocks of prompts reserved for a prefill worker's KV that this worker's "
                    "prefix cache held already, so they were not sent.")
              .Register(r)
              .Add({})),
      prompt_tokens_(prometheus::BuildCounter()
                         .Name("trident_worker_prompt_tokens_total")
                         .Help("Prompt tokens accepted.")
                         .Register(r)
                         .Add({})),
      generated_tokens_(prometheus::BuildCounter()
                            .Name("trident_worker_generation_tokens_total")
                            .Help("Tokens generated.")
                            .Register(r)
                            .Add({})),
      preemptions_(prometheus::BuildCounter()
                       .Name("trident_worker_preemptions_total")
                       .Help("Sequences preempted (freed and recomputed later) for want of KV "
                             "blocks.")
                       .Register(r)
                       .Add({})),
      steps_(prometheus::BuildCounter()
                 .Name("trident_worker_engine_steps_total")
                 .Help("Forward passes run by the engine.")
                 .Register(r)
                 .Add({})),
      step_seconds_(prometheus::BuildCounter()
                        .Name("trident_worker_step_seconds_total")
                        .Help("Time in forward steps (scheduling, the forward pass and "
                              "sampling), summed; against wall time, the share the engine loop "
                              "spent stepping rather than between steps or idle.")
                        .Register(r)
                        .Add({})),
      backlogged_steps_(prometheus::BuildCounter()
                            .Name("trident_worker_backlogged_steps_total")
                            .Help("Steps whose prompt chunks took the raised cap of a prefill "
                                  "backlog (--max_prefill_tokens_when_backlogged).")
                            .Register(r)
                            .Add({})),
      delivery_batches_(prometheus::BuildCounter()
                            .Name("trident_worker_token_delivery_batches_total")
                            .Help("Steps' token batches whose callbacks (streaming each token "
                                  "to its caller) the engine's delivery thread has begun.")
                            .Register(r)
                            .Add({})),
      delivery_lag_(prometheus::BuildCounter()
                        .Name("trident_worker_token_delivery_lag_seconds_total")
                        .Help("Time those batches waited for the delivery thread, summed; a "
                              "mean near a step's duration or above means the callbacks fall "
                              "behind the steps.")
                        .Register(r)
                        .Add({})),
      iteration_tokens_(prometheus::BuildHistogram()
                            .Name("trident_worker_iteration_tokens")
                            .Help("Tokens per forward pass (prompt chunks and decode tokens).")
                            .Register(r)
                            .Add({}, IterationTokensBuckets())),
      iteration_decode_sequences_(
          prometheus::BuildHistogram()
              .Name("trident_worker_iteration_decode_sequences")
              .Help("One-token decode sequences per forward pass, for passes that had any.")
              .Register(r)
              .Add({}, IterationDecodeSequencesBuckets())),
      cpu_sequences_(prometheus::BuildGauge()
                         .Name("trident_worker_cpu_attention_sequences")
                         .Help("Running sequences whose decode attention runs on a CPU "
                               "attention service (their KV held there).")
                         .Register(r)
                         .Add({})),
      cpu_tokens_(prometheus::BuildGauge()
                      .Name("trident_worker_cpu_attention_tokens")
                      .Help("KV tokens of the CPU-resident sequences.")
                      .Register(r)
                      .Add({})),
      offload_family_(prometheus::BuildCounter()
                          .Name("trident_worker_offload_decisions_total")
                          .Help("Sequences moved to CPU attention services (moved), or "
                                "placed there at admission with their prompt written there by "
                                "the prefill worker (placed); moves chosen but refused by a guard "
                                "(held), that failed (failed), or "
                                "whose background copy outlived the sequence (dropped); and "
                                "sequences brought back for recompute because their service "
                                "failed (demoted).")
                          .Register(r)),
      offload_moved_(offload_family_.Add({{"decision", "moved"}})),
      offload_placed_(offload_family_.Add({{"decision", "placed"}})),
      offload_held_(offload_family_.Add({{"decision", "held"}})),
      offload_failed_(offload_family_.Add({{"decision", "failed"}})),
      offload_dropped_(offload_family_.Add({{"decision", "dropped"}})),
      offload_demoted_(offload_family_.Add({{"decision", "demoted"}})),
      offload_tokens_family_(prometheus::BuildCounter()
                                 .Name("trident_worker_offload_moved_tokens_total")
                                 .Help("KV tokens of sequences moved to CPU attention services: "
                                       "read in place from the service's block store (in_place), "
                                       "or copied there (copied).")
                                 .Register(r)),
      offload_in_place_tokens_(offload_tokens_family_.Add({{"how", "in_place"}})),
      offload_copied_tokens_(offload_tokens_family_.Add({{"how", "copied"}})),
      step_hook_(prometheus::BuildCounter()
                     .Name("trident_worker_step_hook_seconds_total")
                     .Help("Time the engine loop spent before steps in its step hook (offload "
                           "moves copy a sequence's KV there), while every running sequence "
                           "waited.")
                     .Register(r)
                     .Add({})),
      decode_step_(prometheus::BuildHistogram()
                       .Name("trident_worker_decode_step_seconds")
                       .Help("Duration of steps that ran only decode sequences (one token each).")
                       .Register(r)
                       .Add({}, DecodeStepSecondsBuckets())),
      mixed_step_(prometheus::BuildHistogram()
                      .Name("trident_worker_mixed_step_seconds")
                      .Help("Duration of steps that ran prompt tokens beside decode sequences "
                            "(chunked prefill in a decode batch).")
                      .Register(r)
                      .Add({}, DecodeStepSecondsBuckets())),
      pipelined_steps_(prometheus::BuildCounter()
                           .Name("trident_worker_pipelined_steps_total")
                           .Help("Decode steps run as two sub-batches, the second's CPU "
                                 "attention under the first's work (asymmetric pipelining).")
                           .Register(r)
                           .Add({})),
      cpu_round_trip_(prometheus::BuildCounter()
                          .Name("trident_worker_cpu_attention_seconds_total")
                          .Help("Time from each CPU attention request's start to its answer, "
                                "summed.")
                          .Register(r)
                          .Add({})),
      cpu_exposed_(prometheus::BuildCounter()
                       .Name("trident_worker_cpu_attention_exposed_seconds_total")
                       .Help("Of trident_worker_cpu_attention_seconds_total, the time steps "
                             "stood waiting for the answers (not hidden under other work).")
                       .Register(r)
                       .Add({})),
      cpu_hidden_(prometheus::BuildGauge()
                      .Name("trident_worker_cpu_attention_hidden_ratio")
                      .Help("Share of CPU attention time hidden under the worker's own work, "
                            "over the last step that had any.")
                      .Register(r)
                      .Add({})),
      cpu_cost_scale_(prometheus::BuildGauge()
                          .Name("trident_worker_offload_cpu_cost_scale")
                          .Help("The offload planner's CPU attention costs over its start-up "
                                "table: observed request time over planned, averaged over recent "
                                "decode steps (1 without offload).")
                          .Register(r)
                          .Add({})),
      graphs_(prometheus::BuildGauge()
                  .Name("trident_worker_cuda_graphs")
                  .Help("Decode step graphs captured (CUDA backend), all at start-up: a value "
                        "that grows while serving would mean a capture on the serving path.")
                  .Register(r)
                  .Add({})),
      graph_replays_(prometheus::BuildCounter()
                         .Name("trident_worker_cuda_graph_replays_total")
                         .Help("Decode steps replayed from a start-up graph.")
                         .Register(r)
                         .Add({})),
      graph_misses_(prometheus::BuildCounter()
                        .Name("trident_worker_cuda_graph_misses_total")
                        .Help("Decode steps with no start-up graph for their batch and context "
                              "(beyond --cuda_graph_max_batch / --cuda_graph_max_context): "
                              "launched kernel by kernel, never captured.")
                        .Register(r)
                        .Add({})) {}

void EngineMetrics::Update(const engine::EngineStats& s) {
  running_.Set(s.running);
  waiting_.Set(s.waiting);
  kv_blocks_.Set(s.blocks_total);
  kv_cached_blocks_.Set(s.blocks_cached);
  prefix_queries_.Increment(
      static_cast<double>(s.prefix_cache_queries_total - last_.prefix_cache_queries_total));
  const int64_t hits = s.prefix_cache_hits_total - last_.prefix_cache_hits_total;
  const int64_t dram = std::min(hits, dram_pending_.load());
  dram_pending_.fetch_sub(dram);
  prefix_hits_gpu_.Increment(static_cast<double>(hits - dram));
  kv_transfer_cached_blocks_.Increment(static_cast<double>(s.kv_reserved_cached_blocks_total -
                                                           last_.kv_reserved_cached_blocks_total));
  kv_invariant_failures_.Increment(
      static_cast<double>(s.kv_invariant_failures_total - last_.kv_invariant_failures_total));
  kv_usage_.Set(s.blocks_total > 0 ? 1.0 - static_cast<double>(s.blocks_free) / s.blocks_total
                                   : 0.0);
  prompt_tokens_.Increment(static_cast<double>(s.prompt_tokens_total - last_.prompt_tokens_total));
  generated_tokens_.Increment(
      static_cast<double>(s.generated_tokens_total - last_.generated_tokens_total));
  preemptions_.Increment(static_cast<double>(s.preemptions_total - last_.preemptions_total));
  steps_.Increment(static_cast<double>(s.steps_total - last_.steps_total));
  backlogged_steps_.Increment(
      static_cast<double>(s.backlogged_steps_total - last_.backlogged_steps_total));
  delivery_batches_.Increment(
      static_cast<double>(s.delivered_batches_total - last_.delivered_batches_total));
  delivery_lag_.Increment(
      std::max(0.0, s.delivery_lag_seconds_total - last_.delivery_lag_seconds_total));
  if (s.steps_total > last_.steps_total) {
    // One observation per call: the observer runs after every iteration,
    // which runs at most one step.
    iteration_tokens_.Observe(s.last_step_tokens);
    step_seconds_.Increment(std::max(0.0, s.last_step_seconds));
    if (s.last_step_decode_sequences > 0) {
      iteration_decode_sequences_.Observe(s.last_step_decode_sequences);
      (s.last_step_prefill_tokens == 0 ? decode_step_ : mixed_step_).Observe(s.last_step_seconds);
    }
  }
  cpu_sequences_.Set(s.remote_running);
  cpu_tokens_.Set(static_cast<double>(s.remote_tokens));
  offload_moved_.Increment(static_cast<double>(s.remote_moves_total - last_.remote_moves_total));
  offload_in_place_tokens_.Increment(
      static_cast<double>(s.remote_in_place_tokens_total - last_.remote_in_place_tokens_total));
  offload_copied_tokens_.Increment(
      static_cast<double>(s.remote_copied_tokens_total - last_.remote_copied_tokens_total));
  offload_placed_.Increment(static_cast<double>(s.remote_placed_total - last_.remote_placed_total));
  offload_held_.Increment(static_cast<double>(s.remote_held_total - last_.remote_held_total));
  offload_failed_.Increment(
      static_cast<double>(s.remote_move_failures_total - last_.remote_move_failures_total));
  offload_dropped_.Increment(
      static_cast<double>(s.remote_moves_dropped_total - last_.remote_moves_dropped_total));
  step_hook_.Increment(std::max(0.0, s.step_hook_seconds_total - last_.step_hook_seconds_total));
  offload_demoted_.Increment(
      static_cast<double>(s.remote_demoted_total - last_.remote_demoted_total));
  pipelined_steps_.Increment(
      static_cast<double>(s.pipelined_steps_total - last_.pipelined_steps_total));
  const double round_trip =
      s.remote_round_trip_seconds_total - last_.remote_round_trip_seconds_total;
  const double exposed = s.remote_exposed_seconds_total - last_.remote_exposed_seconds_total;
  cpu_round_trip_.Increment(std::max(0.0, round_trip));
  cpu_exposed_.Increment(std::max(0.0, exposed));
  cpu_cost_scale_.Set(s.cpu_cost_scale);
  if (round_trip > 0) cpu_hidden_.Set(std::clamp(1.0 - exposed / round_trip, 0.0, 1.0));
  graphs_.Set(static_cast<double>(s.graphs.captured));
  graph_replays_.Increment(static_cast<double>(s.graphs.replays - last_.graphs.replays));
  graph_misses_.Increment(static_cast<double>(s.graphs.misses - last_.graphs.misses));
  last_ = s;
}

void EngineMetrics::AddDramHits(int64_t tokens) {
  if (tokens <= 0) return;
  prefix_hits_dram_.Increment(static_cast<double>(tokens));
  dram_pending_.fetch_add(tokens);
}

}  // namespace trident::worker
