#include "services/worker/worker_model.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/model/config.h"
#ifdef TRIDENT_HAVE_CUDA
#include "common/backend/cuda/cuda_backend.h"
#endif
#include "common/frontend/model_info.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"

namespace trident::worker {
namespace {

namespace v1 = ::trident::v1;

// Engine gauges and counters, fed by the engine's per-step stats.
struct EngineMetrics {
  explicit EngineMetrics(prometheus::Registry& r)
      : running(prometheus::BuildGauge()
                    .Name("trident_worker_num_requests_running")
                    .Help("Requests in the running batch.")
                    .Register(r)
                    .Add({})),
        waiting(prometheus::BuildGauge()
                    .Name("trident_worker_num_requests_waiting")
                    .Help("Requests waiting to be scheduled (including preempted ones).")
                    .Register(r)
                    .Add({})),
        kv_usage(prometheus::BuildGauge()
                     .Name("trident_worker_kv_cache_usage_ratio")
                     .Help("Fraction of KV cache blocks in use.")
                     .Register(r)
                     .Add({})),
        kv_blocks_total(prometheus::BuildGauge()
                            .Name("trident_worker_kv_blocks_total")
                            .Help("KV cache blocks in the pool.")
                            .Register(r)
                            .Add({})),
        prompt_tokens(prometheus::BuildCounter()
                          .Name("trident_worker_prompt_tokens_total")
                          .Help("Prompt tokens accepted.")
                          .Register(r)
                          .Add({})),
        generated_tokens(prometheus::BuildCounter()
                             .Name("trident_worker_generation_tokens_total")
                             .Help("Tokens generated.")
                             .Register(r)
                             .Add({})),
        preemptions(prometheus::BuildCounter()
                        .Name("trident_worker_preemptions_total")
                        .Help("Sequences preempted (freed and recomputed later) for want of KV "
                              "blocks.")
                        .Register(r)
                        .Add({})),
        steps(prometheus::BuildCounter()
                  .Name("trident_worker_engine_steps_total")
                  .Help("Forward passes run by the engine.")
                  .Register(r)
                  .Add({})),
        cpu_sequences(prometheus::BuildGauge()
                          .Name("trident_worker_cpu_attention_sequences")
                          .Help("Running sequences whose decode attention runs on a CPU "
                                "attention service (their KV held there).")
                          .Register(r)
                          .Add({})),
        cpu_tokens(prometheus::BuildGauge()
                       .Name("trident_worker_cpu_attention_tokens")
                       .Help("KV tokens of the CPU-resident sequences.")
                       .Register(r)
                       .Add({})),
        offload_family(prometheus::BuildCounter()
                           .Name("trident_worker_offload_decisions_total")
                           .Help("Sequences moved to CPU attention services (moved), and brought "
                                 "back for recompute because their service failed (demoted).")
                           .Register(r)),
        offload_moved(offload_family.Add({{"decision", "moved"}})),
        offload_demoted(offload_family.Add({{"decision", "demoted"}})),
        pipelined_steps(prometheus::BuildCounter()
                            .Name("trident_worker_pipelined_steps_total")
                            .Help("Decode steps run as two sub-batches, the second's CPU "
                                  "attention under the first's work (asymmetric pipelining).")
                            .Register(r)
                            .Add({})),
        cpu_round_trip(prometheus::BuildCounter()
                           .Name("trident_worker_cpu_attention_seconds_total")
                           .Help("Time from each CPU attention request's start to its answer, "
                                 "summed.")
                           .Register(r)
                           .Add({})),
        cpu_exposed(prometheus::BuildCounter()
                        .Name("trident_worker_cpu_attention_exposed_seconds_total")
                        .Help("Of trident_worker_cpu_attention_seconds_total, the time steps "
                              "stood waiting for the answers (not hidden under other work).")
                        .Register(r)
                        .Add({})),
        cpu_hidden(prometheus::BuildGauge()
                       .Name("trident_worker_cpu_attention_hidden_ratio")
                       .Help("Share of CPU attention time hidden under the worker's own work, "
                             "over the last step that had any.")
                       .Register(r)
                       .Add({})) {}

  void Update(const engine::EngineStats& s) {
    running.Set(s.running);
    waiting.Set(s.waiting);
    kv_blocks_total.Set(s.blocks_total);
    kv_usage.Set(s.blocks_total > 0 ? 1.0 - static_cast<double>(s.blocks_free) / s.blocks_total
                                    : 0.0);
    prompt_tokens.Increment(static_cast<double>(s.prompt_tokens_total - last.prompt_tokens_total));
    generated_tokens.Increment(
        static_cast<double>(s.generated_tokens_total - last.generated_tokens_total));
    preemptions.Increment(static_cast<double>(s.preemptions_total - last.preemptions_total));
    steps.Increment(static_cast<double>(s.steps_total - last.steps_total));
    cpu_sequences.Set(s.remote_running);
    cpu_tokens.Set(static_cast<double>(s.remote_tokens));
    offload_moved.Increment(static_cast<double>(s.remote_moves_total - last.remote_moves_total));
    offload_demoted.Increment(
        static_cast<double>(s.remote_demoted_total - last.remote_demoted_total));
    pipelined_steps.Increment(
        static_cast<double>(s.pipelined_steps_total - last.pipelined_steps_total));
    const double round_trip =
        s.remote_round_trip_seconds_total - last.remote_round_trip_seconds_total;
    const double exposed = s.remote_exposed_seconds_total - last.remote_exposed_seconds_total;
    cpu_round_trip.Increment(std::max(0.0, round_trip));
    cpu_exposed.Increment(std::max(0.0, exposed));
    if (round_trip > 0) cpu_hidden.Set(std::clamp(1.0 - exposed / round_trip, 0.0, 1.0));
    last = s;
  }

  prometheus::Gauge& running;
  prometheus::Gauge& waiting;
  prometheus::Gauge& kv_usage;
  prometheus::Gauge& kv_blocks_total;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& generated_tokens;
  prometheus::Counter& preemptions;
  prometheus::Counter& steps;
  prometheus::Gauge& cpu_sequences;
  prometheus::Gauge& cpu_tokens;
  prometheus::Family<prometheus::Counter>& offload_family;
  prometheus::Counter& offload_moved;
  prometheus::Counter& offload_demoted;
  prometheus::Counter& pipelined_steps;
  prometheus::Counter& cpu_round_trip;
  prometheus::Counter& cpu_exposed;
  prometheus::Gauge& cpu_hidden;
  engine::EngineStats last;
};

absl::StatusOr<numeric::DType> ParseDtype(const std::string& dtype) {
  if (dtype == "f32") return numeric::DType::kF32;
  if (dtype == "bf16") return numeric::DType::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype must be f32 or bf16, got \"", dtype, "\""));
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerModel>> LoadWorkerModel(const WorkerModelOptions& options,
                                                             prometheus::Registry* registry) {
  if (options.model_dir.empty()) {
    return absl::InvalidArgumentError("--model: a model directory is required");
  }
  TRIDENT_ASSIGN_OR_RETURN(numeric::DType dtype, ParseDtype(options.dtype));
  auto model = std::make_unique<WorkerModel>();
  TRIDENT_ASSIGN_OR_RETURN(model->tokenizer,
                           tokenizer::Tokenizer::FromDirectory(options.model_dir));

  if (options.bf16_activations != "round" && options.bf16_activations != "split") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bf16_activations must be round or split, got \"", options.bf16_activations, "\""));
  }
  TRIDENT_ASSIGN_OR_RETURN(model::ModelConfig c, model::LoadModelConfig(options.model_dir));
  std::unique_ptr<backend::ModelBackend> backend;
  if (options.cuda_device >= 0) {
#ifdef TRIDENT_HAVE_CUDA
    backend::CudaBackendOptions co;
    co.device = options.cuda_device;
    co.gpu_memory_fraction = options.gpu_memory_fraction;
    co.cuda_graphs = options.cuda_graphs;
    co.kv_cache_tokens = options.gpu_kv_cache_tokens;
    co.kv_block_size = options.kv_block_size;
    co.max_batch_tokens = options.max_batch_tokens;
    co.max_batch_sequences = options.max_running;
    co.max_model_len = options.max_model_len;
    TRIDENT_ASSIGN_OR_RETURN(backend, backend::CudaBackend::Create(options.model_dir, co));
#else
    return absl::FailedPreconditionError(
        "--device=cuda: this worker was built without CUDA; rebuild where nvcc is installed, or "
        "use --device=cpu");
#endif
  } else {
    backend::CpuBackendOptions bo;
    bo.compute_dtype = dtype;
    bo.bf16_split_activations = options.bf16_activations == "split";
    bo.kv_dtype = dtype;
    bo.kv_cache_bytes = options.kv_cache_bytes;
    bo.kv_block_size = options.kv_block_size;
    bo.max_model_len = options.max_model_len;
    bo.num_threads = options.cpu_threads;
    bo.pin_threads = options.pin_threads;
    TRIDENT_ASSIGN_OR_RETURN(backend, backend::CpuBackend::Create(options.model_dir, bo));
  }
  if (model->tokenizer->vocab_size() > c.vocab_size) {
    return absl::FailedPreconditionError(
        absl::StrCat(options.model_dir, ": tokenizer.json has ", model->tokenizer->vocab_size(),
                     " tokens but config.json's vocab_size is ", c.vocab_size));
  }

  const numeric::DType served = options.cuda_device >= 0 ? numeric::DType::kBF16 : dtype;
  model->info =
      frontend::ModelInfoFor(c, *model->tokenizer, options.model_dir, options.model_name,
                             backend->max_model_len(), backend->kv_capacity().block_size, served);

  engine::EngineOptions eo;
  eo.max_batch_tokens = options.max_batch_tokens;
  eo.max_running = options.max_running;
  if (eo.max_batch_tokens < 1 || eo.max_running < 1) {
    return absl::InvalidArgumentError("--max_batch_tokens and --max_running must be at least 1");
  }
  model->engine = std::make_unique<engine::Engine>(std::move(backend), eo);
  if (registry != nullptr) {
    auto metrics = std::make_shared<EngineMetrics>(*registry);
    model->engine->SetStatsObserver(
        [metrics](const engine::EngineStats& stats) { metrics->Update(stats); });
  }
  return model;
}

}  // namespace trident::worker
