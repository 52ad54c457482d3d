#include "services/worker/worker_model.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/model/config.h"
#include "common/model/generate/model_gen.h"
#include "common/model/generate/random_weights.h"
#ifdef TRIDENT_HAVE_CUDA
#include "common/backend/cuda/cuda_backend.h"
#endif
#include "common/frontend/model_info.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"
#include "services/worker/engine_metrics.h"

namespace trident::worker {
namespace {

namespace v1 = ::trident::v1;

absl::StatusOr<numeric::DType> ParseDtype(const std::string& dtype) {
  if (dtype == "f32") return numeric::DType::kF32;
  if (dtype == "bf16") return numeric::DType::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype must be f32 or bf16, got \"", dtype, "\""));
}

}  // namespace

std::string CacheModelIdentity(const model::ModelConfig& config, const std::string& served_name,
                               numeric::DType kv_dtype) {
  return absl::StrCat(served_name, "|layers=", config.num_hidden_layers,
                      "|hidden=", config.hidden_size, "|kv_heads=", config.num_key_value_heads,
                      "|head_dim=", config.head_dim, "|vocab=", config.vocab_size,
                      "|kv=", numeric::DTypeName(kv_dtype));
}

namespace {

// --generated_weights: the weights model_dir's generated_weights.json names,
// computed in memory; null without the flag. kFailedPrecondition when they
// are not the model config.json describes.
absl::StatusOr<std::unique_ptr<model::generate::RandomWeights>> GeneratedWeights(
    const WorkerModelOptions& options, const model::ModelConfig& config) {
  if (!options.generated_weights) return nullptr;
  TRIDENT_ASSIGN_OR_RETURN(const model::generate::ModelSpec spec,
                           model::generate::GeneratedSpecOf(options.model_dir));
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<model::generate::RandomWeights> weights,
                           model::generate::RandomWeights::Create(spec));
  const model::ModelConfig& g = weights->config();
  if (g.hidden_size != config.hidden_size || g.num_hidden_layers != config.num_hidden_layers ||
      g.num_attention_heads != config.num_attention_heads ||
      g.num_key_value_heads != config.num_key_value_heads || g.head_dim != config.head_dim ||
      g.intermediate_size != config.intermediate_size || g.vocab_size != config.vocab_size) {
    return absl::FailedPreconditionError(
        absl::StrCat(options.model_dir, ": config.json is not the shape of preset ", spec.preset,
                     " that generated_weights.json names"));
  }
  TRIDENT_LOG(INFO) << "--generated_weights: " << spec.preset << "'s weights (seed " << spec.seed
                    << ") computed in memory";
  return weights;
}

// The engine's options from the worker's, checked (before anything loads).
absl::StatusOr<engine::EngineOptions> EngineOptionsOf(const WorkerModelOptions& options) {
  engine::EngineOptions eo;
  eo.max_batch_tokens = options.max_batch_tokens;
  eo.max_prefill_tokens_while_decoding = options.max_prefill_tokens_while_decoding;
  eo.max_prefill_tokens_when_backlogged = options.max_prefill_tokens_when_backlogged;
  eo.prefill_backlog_tokens = options.prefill_backlog_tokens;
  eo.max_running = options.max_running;
  eo.prefix_caching = options.prefix_caching;
  eo.shared_prefix_wait_steps = options.shared_prefix_wait_steps;
  if (eo.max_batch_tokens < 1 || eo.max_running < 1) {
    return absl::InvalidArgumentError("--max_batch_tokens and --max_running must be at least 1");
  }
  if (eo.max_prefill_tokens_while_decoding < 0 || eo.max_prefill_tokens_when_backlogged < 0 ||
      eo.prefill_backlog_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_prefill_tokens_while_decoding (", eo.max_prefill_tokens_while_decoding,
        ") and --max_prefill_tokens_when_backlogged (", eo.max_prefill_tokens_when_backlogged,
        ") must be at least 0, --prefill_backlog_tokens (", eo.prefill_backlog_tokens,
        ") at least 1"));
  }
  return eo;
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerModel>> LoadWorkerModel(const WorkerModelOptions& options,
                                                             prometheus::Registry* registry) {
  if (options.model_dir.empty()) {
    return absl::InvalidArgumentError("--model: a model directory is required");
  }
  TRIDENT_ASSIGN_OR_RETURN(numeric::DType dtype, ParseDtype(options.dtype));
  TRIDENT_ASSIGN_OR_RETURN(engine::EngineOptions eo, EngineOptionsOf(options));
  auto model = std::make_unique<WorkerModel>();
  TRIDENT_ASSIGN_OR_RETURN(model->tokenizer,
                           tokenizer::Tokenizer::FromDirectory(options.model_dir));

  if (options.bf16_activations != "round" && options.bf16_activations != "split") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--bf16_activations must be round or split, got \"", options.bf16_activations, "\""));
  }
  TRIDENT_ASSIGN_OR_RETURN(model::ModelConfig c, model::LoadModelConfig(options.model_dir));
  numeric::DType kv_dtype = dtype;
  if (options.cuda_device >= 0) {
    if (options.kv_cache_dtype != "bf16" && options.kv_cache_dtype != "fp8_e4m3") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv_cache_dtype must be bf16 or fp8_e4m3, got \"", options.kv_cache_dtype, "\""));
    }
    kv_dtype =
        options.kv_cache_dtype == "fp8_e4m3" ? numeric::DType::kFP8E4M3 : numeric::DType::kBF16;
  } else if (options.kv_cache_dtype != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_cache_dtype=", options.kv_cache_dtype,
        ": the CPU backend keeps its KV cache in --dtype; only the CUDA backend has fp8_e4m3"));
  }
  if (options.tensor_parallel != 1 && options.cuda_device < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensor_parallel=", options.tensor_parallel,
        ": tensor parallelism splits a model over GPUs; the CPU backend runs it whole"));
  }
  TRIDENT_ASSIGN_OR_RETURN(const std::unique_ptr<model::generate::RandomWeights> generated,
                           GeneratedWeights(options, c));
  std::unique_ptr<backend::ModelBackend> backend;
  if (options.cuda_device >= 0) {
#ifdef TRIDENT_HAVE_CUDA
    backend::CudaBackendOptions co;
    co.device = options.cuda_device;
    co.gpu_memory_fraction = options.gpu_memory_fraction;
    co.cuda_graphs = options.cuda_graphs;
    co.graph_max_batch = options.cuda_graph_max_batch;
    co.graph_max_context = options.cuda_graph_max_context;
    co.gemv = options.cuda_gemv;
    co.gemv_bulk = options.cuda_gemv_bulk;
    co.gemv_norm = options.cuda_gemv_fusions;
    co.gemv_rope = options.cuda_gemv_fusions;
    co.gemv_dynamic = options.cuda_gemv_dynamic;
    co.decode_stable_prefix = options.cuda_decode_stable_prefix;
    co.gemm_skinny = options.cuda_gemm_skinny;
    co.gemm_tune_algos = options.cuda_gemm_tune_algos;
    co.pdl_chain = options.cuda_pdl_chain;
    co.kv_cache_tokens = options.gpu_kv_cache_tokens;
    co.kv_block_size = options.kv_block_size;
    co.max_batch_tokens = options.max_batch_tokens;
    co.max_batch_sequences = options.max_running;
    co.max_model_len = options.max_model_len;
    co.kv_cache_dtype = kv_dtype;
    co.tensor_parallel = options.tensor_parallel;
    if (generated != nullptr) {
      TRIDENT_ASSIGN_OR_RETURN(backend, backend::CudaBackend::CreateFromWeights(*generated, c, co));
    } else {
      TRIDENT_ASSIGN_OR_RETURN(backend, backend::CudaBackend::Create(options.model_dir, co));
    }
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
    if (generated != nullptr) {
      TRIDENT_ASSIGN_OR_RETURN(backend, backend::CpuBackend::CreateFromWeights(*generated, c, bo));
    } else {
      TRIDENT_ASSIGN_OR_RETURN(backend, backend::CpuBackend::Create(options.model_dir, bo));
    }
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

  model->config = c;

  eo.cache_model_identity = CacheModelIdentity(c, model->info.model(), kv_dtype);
  model->engine = std::make_unique<engine::Engine>(std::move(backend), eo);
  if (registry != nullptr) {
    auto metrics = std::make_shared<EngineMetrics>(*registry);
    model->metrics = metrics;
    model->engine->SetStatsObserver(
        [metrics](const engine::EngineStats& stats) { metrics->Update(stats); });
  }
  return model;
}

}  // namespace trident::worker
