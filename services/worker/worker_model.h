// Loads what a worker serves: the tokenizer, the model backend and the
// engine around it, plus the ModelInfo the public API reports and the
// worker's engine metrics.

#ifndef TRIDENT_SERVICES_WORKER_WORKER_MODEL_H_
#define TRIDENT_SERVICES_WORKER_WORKER_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/engine/engine.h"
#include "common/model/config.h"
#include "common/numeric/dtype.h"
#include "common/tokenizer/tokenizer.h"
#include "prometheus/registry.h"
#include "services/worker/engine_metrics.h"
#include "trident/v1/generation.pb.h"

namespace trident::worker {

struct WorkerModelOptions {
  // Hugging Face model directory.
  std::string model_dir;
  // -1: the CPU backend; N >= 0: the CUDA backend on device N.
  int32_t cuda_device = -1;
  // CUDA: share of the device's memory for weights, workspace and KV cache.
  double gpu_memory_fraction = 0.9;
  // CUDA: GPUs the model is split over (cuda_device onwards).
  int32_t tensor_parallel = 1;
  // The weights computed in memory from model_dir's generated_weights.json
  // (model/generate's RandomWeights) instead of read from safetensors.
  bool generated_weights = false;
  // CUDA: caps the KV cache at this many tokens (0: what the memory
  // fraction leaves).
  int32_t gpu_kv_cache_tokens = 0;
  // CUDA: replay decode steps from CUDA graphs, all captured at start-up
  // for padded batches up to cuda_graph_max_batch and contexts up to
  // cuda_graph_max_context (0: the backend's limits).
  bool cuda_graphs = true;
  int32_t cuda_graph_max_batch = 0;
  int32_t cuda_graph_max_context = 0;
  // Single-row projections take the GEMV kernel (CudaBackendOptions::gemv).
  bool cuda_gemv = true;
  // On sm_90, those projections take Hopper's bulk-copy GEMV
  // (CudaBackendOptions::gemv_bulk).
  bool cuda_gemv_bulk = true;
  // On sm_90, that GEMV fuses the norms ahead of it and RoPE and the KV
  // append after q/k/v (CudaBackendOptions::gemv_norm and gemv_rope).
  bool cuda_gemv_fusions = true;
  // On sm_90, that GEMV hands its items to CTAs as they ask
  // (CudaBackendOptions::gemv_dynamic).
  bool cuda_gemv_dynamic = true;
  // Decode attention loads the cached prefix before its PDL wait
  // (CudaBackendOptions::decode_stable_prefix).
  bool cuda_decode_stable_prefix = true;
  // On sm_90, decode batches' projections take Hopper's skinny GEMM
  // (CudaBackendOptions::gemm_skinny).
  bool cuda_gemm_skinny = false;
  int32_t cuda_gemm_tune_algos = 0;  // CudaBackendOptions::gemm_tune_algos
  // The small kernels launched with PDL too (CudaBackendOptions::pdl_chain).
  bool cuda_pdl_chain = true;
  // Name reported by ModelInfo; empty: the directory's last component.
  std::string model_name;
  // "f32" or "bf16": matmul weights and inputs, and the KV cache.
  std::string dtype = "f32";
  // CUDA backend: "bf16" or "fp8_e4m3" (CudaBackendOptions::kv_cache_dtype).
  std::string kv_cache_dtype = "bf16";
  // With dtype bf16: "round" matmul inputs to bf16 (fastest) or "split" them
  // into two bf16 terms (near-f32 accuracy, matmuls do twice the work).
  std::string bf16_activations = "round";
  int64_t kv_cache_bytes = int64_t{512} << 20;
  int32_t kv_block_size = 16;
  int32_t cpu_threads = 0;
  bool pin_threads = true;
  int32_t max_batch_tokens = 2048;
  // engine::EngineOptions::max_prefill_tokens_while_decoding.
  int32_t max_prefill_tokens_while_decoding = 256;
  // engine::EngineOptions::max_prefill_tokens_when_backlogged (0: off) and
  // prefill_backlog_tokens.
  int32_t max_prefill_tokens_when_backlogged = 1024;
  int32_t prefill_backlog_tokens = 4096;
  int32_t max_running = 256;
  int32_t max_model_len = 0;
  // Automatic prefix caching (engine::EngineOptions::prefix_caching).
  bool prefix_caching = true;
  // engine::EngineOptions::shared_prefix_wait_steps.
  int32_t shared_prefix_wait_steps = 8;
};

// What besides the tokens decides a served model's KV, for the prefix
// cache's block keys (kv::BlockHasher's model): the name it is served
// under, its shape and the KV dtype. Workers serving the same model with
// the same KV dtype agree; a different model or dtype never matches.
std::string CacheModelIdentity(const model::ModelConfig& config, const std::string& served_name,
                               numeric::DType kv_dtype);

struct WorkerModel {
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  std::unique_ptr<engine::Engine> engine;
  trident::v1::ModelInfoResponse info;
  // The model's config.json.
  model::ModelConfig config;
  // The engine's metrics (null without a registry).
  std::shared_ptr<EngineMetrics> metrics;
};

// INVALID_ARGUMENT / FAILED_PRECONDITION for a bad model directory or
// options, naming the file or flag. With `registry`, exports the engine's
// gauges and counters (trident_worker_*) into it.
absl::StatusOr<std::unique_ptr<WorkerModel>> LoadWorkerModel(const WorkerModelOptions& options,
                                                             prometheus::Registry* registry);

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_WORKER_MODEL_H_
