// The CUDA backend: the same Llama-family decoder as backend/cpu, on one GPU.
// Weights and the paged KV cache live in device memory in bf16; GEMMs run on
// cuBLASLt (fp32 accumulation); embedding, fused residual+RMSNorm, RoPE, KV
// append, SwiGLU and paged prefill/decode attention are the project's own
// kernels (kernels/cuda). Everything is enqueued on the backend's own stream;
// Forward synchronizes that stream once, to hand fp32 logits to the host;
// ForwardSample samples on the GPU and hands over only tokens and logprobs.
//
// Numerics: the residual stream is fp32 and the o/down projections add into
// it directly (cuBLASLt with beta = 1, fp32 output); the qkv and gate/up
// projections come out in fp32 and are rounded to bf16 once, after RoPE and
// after SwiGLU; attention reads bf16 q and KV and accumulates in fp32.
//
// Decode steps (every sequence one token) replay CUDA graphs captured per
// (batch bucket, decode split count): the batch is padded to the bucket with
// sequences that write a scratch KV block nobody reads.
//
// Device memory is budgeted at start: weights, then activation workspace for
// `max_batch_tokens`, then the KV pool takes what `gpu_memory_fraction` of
// the device leaves.

#ifndef TRIDENT_COMMON_BACKEND_CUDA_CUDA_BACKEND_H_
#define TRIDENT_COMMON_BACKEND_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/cuda/tp_kv_copier.h"
#include "common/backend/model_backend.h"
#include "common/model/checkpoint.h"
#include "common/model/config.h"
#include "common/model/tensor_parallel/kv_view.h"
#include "common/numeric/dtype.h"
#include "common/time/clock.h"

namespace trident::backend {

struct CudaBackendOptions {
  int32_t device = 0;
  // Share of the device's memory the backend may use (weights, workspace and
  // KV pool together), counted from what was free when it started: two
  // backends (or processes) of 0.45 each share one device.
  double gpu_memory_fraction = 0.9;
  int32_t kv_block_size = 16;
  // Largest number of tokens one Forward may carry (sizes the workspace).
  int32_t max_batch_tokens = 8192;
  // Most sequences one Forward may carry.
  int32_t max_batch_sequences = 256;
  // Caps the context window (0: the model's max_position_embeddings).
  int32_t max_model_len = 0;
  // Replay decode steps from CUDA graphs (see above), all captured at
  // start-up (nothing is captured while serving): one per padded batch
  // bucket up to graph_max_batch (0: max_batch_sequences) and context
  // bucket (powers of two) up to graph_max_context (0: max_model_len). A
  // decode step outside them launches its kernels one by one
  // (GraphStats::misses).
  bool cuda_graphs = true;
  int32_t graph_max_batch = 0;
  int32_t graph_max_context = 0;
  // Sample on the GPU (ForwardSample; kernels/cuda/sampling): only tokens
  // and logprobs cross to the host. False: logits go to the host sampler.
  bool device_sampling = true;
  // Caps the KV pool at this many tokens (0: whatever the memory budget
  // leaves), to serve a workload that does not fit (offload benchmarks).
  int32_t kv_cache_tokens = 0;
  // Decode attention kernel variant (kernels/cuda/paged_decode_attention);
  // -1: PlanDecodeAuto's pick (over an FP8 cache, the FP8 default).
  int32_t decode_variant = -1;
  // With pdl_chain: decode attention copies the cached positions before
  // the step's token while the q/k/v projection ahead of it still runs
  // (PagedDecodeArgs::stable_prefix).
  bool decode_stable_prefix = true;
  // Single-row projections (a decode step of one sequence) take the
  // weight-streaming GEMV kernel of kernels/cuda/gemm instead of cuBLASLt
  // (GemmOptions::gemv); false: cuBLASLt for all.
  bool gemv = true;
  // On sm_90 those projections take Hopper's GEMV, which streams weights
  // through shared memory by the bulk copy engine (GemmOptions::gemv_bulk);
  // false: the register-streaming GEMV.
  bool gemv_bulk = true;
  // Hopper's GEMV hands its items to CTAs as they ask
  // (GemmOptions::gemv_dynamic).
  bool gemv_dynamic = true;
  // Hopper's GEMV takes the RMSNorm ahead of a single-row projection
  // itself (q/k/v, gate/up and the LM head: GemmArgs::norm_weight), so
  // those norms launch no kernel; the same bits either way.
  bool gemv_norm = true;
  // Hopper's GEMV rotates a single token's q and k in its q/k/v
  // projection's epilogue and stores its k and v in a bf16 cache
  // (Gemm::RunRope), so RoPE and the KV append launch no kernel; the same
  // bits either way.
  bool gemv_rope = true;
  // On sm_90, projections of 2-64 rows (decode batches) take Hopper's skinny
  // GEMM, the MLP's activation fused into the gate/up projection
  // (GemmOptions::skinny; slower than cuBLASLt so far, hence off). Without
  // it, the fused gate/up + SwiGLU of up to 64 rows still takes the skinny
  // GEMM, where it measured ahead (GemmOptions::skinny_silu_max_rows).
  bool gemm_skinny = false;
  // The fused gate/up's row limit above (0: cuBLASLt and the activation
  // kernel for every batch).
  int64_t gemm_skinny_silu_max_rows = 64;
  // With gemm_skinny: projections whose tiles fit one wave as clusters
  // split each tile's k within a cluster (GemmOptions::skinny_cluster_split;
  // not yet measured, hence off).
  bool gemm_skinny_cluster = false;
  // cuBLASLt's projections in the decode graphs (batches past the GEMV's
  // one row): up to this many of its candidate algorithms are timed for each
  // shape while the graphs are captured at start-up, and the fastest kept
  // (GemmOptions::tune_algos). 0: the heuristic's first choice (the same
  // algorithms, so the same bits, in every process).
  int gemm_tune_algos = 0;
  // Weights a reader computes rather than stores (model/generate's
  // RandomWeights, for benchmarks of large presets) are computed on the
  // device where they live (kernels/cuda's random_fill), the same bits as
  // the host computes; false: computed on host cores and copied.
  bool device_generated_weights = true;
  // Launch those GEMVs with programmatic dependent launch (GemmOptions).
  bool pdl = true;
  // Launch the norms, RoPE, the KV append, SwiGLU and decode attention with
  // programmatic dependent launch too (each waits for the kernel ahead at its
  // first instruction: kernels/cuda/pdl): every kernel of a layer may be
  // scheduled before the one ahead ends, so launch gaps and the next
  // projection's first weight loads overlap the kernels ahead (the sums of
  // tensor parallelism included). On an H200 (8B shape) it shortened decode
  // steps 1-2% at batch 1, 16 and 64 (bench/RESULTS.md). Tensor-parallel
  // ranks that share a device take neither this nor `pdl`: a kernel
  // resident early behind one rank's spinning sum would starve the other.
  bool pdl_chain = true;
  // The KV cache's element type: kBF16, or kFP8E4M3 (half the bytes per
  // token, so twice the tokens in the pool; per-token, per-head scales;
  // KV_BLOCK_LAYOUT_FP8_GROUPED_SCALED, kv_block_size a multiple of 16). An
  // FP8 cache serves no CPU-resident sequences (supports_remote_attention).
  numeric::DType kv_cache_dtype = numeric::DType::kBF16;
  // Tensor parallelism: the model split over this many GPUs of the process
  // (cuda_backend_impl.h, TpGroup), rank r on tensor_parallel_devices[r],
  // or on device + r when that list is empty (a list may name one GPU
  // twice: ranks that share it, for tests). Needs peer access between the
  // GPUs; serves no CPU-resident sequences.
  int32_t tensor_parallel = 1;
  std::vector<int32_t> tensor_parallel_devices;
  // Row-parallel sums of at least this many bytes (a step's rows x hidden x
  // 4) go through NCCL, smaller ones through the peer all-reduce kernel.
  int64_t tensor_parallel_nccl_min_bytes = int64_t{4} << 20;
  // For load-progress reporting; nullptr means the real clock.
  Clock* clock = nullptr;
};

namespace cuda_internal {
struct Impl;
}  // namespace cuda_internal

class CudaBackend : public ModelBackend {
 public:
  // FAILED_PRECONDITION when the device is missing or the model does not fit
  // in the memory budget; INVALID_ARGUMENT / FAILED_PRECONDITION for bad or
  // unsupported models, naming the file and tensor.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const std::string& model_dir,
                                                             const CudaBackendOptions& options);
  // The same over weights from any reader, with their config: a benchmark
  // loads model/generate's RandomWeights without a checkpoint on disk. The
  // weights are not checked against the config (a checkpoint's are).
  static absl::StatusOr<std::unique_ptr<CudaBackend>> CreateFromWeights(
      const model::TensorReader& weights, const model::ModelConfig& config,
      const CudaBackendOptions& options);
  ~CudaBackend() override;

  int32_t vocab_size() const override;
  int32_t max_model_len() const override;
  KvCapacity kv_capacity() const override;
  // Under tensor parallelism: the ranks' pools seen as one pool in the TP = 1
  // layout (KvMemory::view; kFailedPrecondition for an FP8 cache), which
  // CreateKvCopier's TensorParallelKvCopier re-shards, so that workers of
  // different TP degrees exchange KV.
  absl::StatusOr<KvMemory> kv_memory() const override;
  GraphStats graph_stats() const override;
  // A CudaKvCopier (cuda_kv_copier.h) for the KV pool, with default options
  // (a TensorParallelKvCopier under tensor parallelism).
  absl::StatusOr<std::unique_ptr<KvCopier>> CreateKvCopier() const override;
  // A CudaKvPeerLane (cuda_peer_lane.h) over every rank's pool.
  absl::StatusOr<std::unique_ptr<KvPeerLane>> CreateKvPeerLane() const override;
  std::string Describe() const override;
  // INVALID_ARGUMENT for batches beyond max_batch_tokens / sequences, bad
  // positions or block ids; INTERNAL for CUDA errors.
  absl::Status Forward(absl::Span<const StepSequence> batch, float* logits) override;
  bool samples_on_device() const override;
  // CPU-resident sequences (StepSequence::remote): after each layer's RoPE
  // their q/k/v rows are copied to the host and sent to their services,
  // and their o comes back before the o projection; such steps run without
  // graphs. A second sub-batch of them (sub_batch 1) runs interleaved with
  // the first, layer by layer, so that its requests are in flight while
  // the GPU runs the first's layer.
  bool supports_remote_attention() const override;
  bool supports_pipelining() const override { return supports_remote_attention(); }
  RemoteAttentionTiming remote_attention_timing() const override;
  // Layer progress through cudaLaunchHostFunc after each layer's KV append.
  bool reports_layer_progress() const override { return true; }
  absl::Status ForwardSample(absl::Span<const StepSequence> batch,
                             absl::Span<const RowSampling> rows,
                             absl::Span<sampling::SampledToken> out) override;

  const model::ModelConfig& config() const;

 private:
  explicit CudaBackend(std::unique_ptr<cuda_internal::Impl> impl);
  absl::StatusOr<model::KvView> TensorParallelKvView() const;
  // Each rank's KV pool (one without tensor parallelism).
  std::vector<TensorParallelKvCopier::RankPool> KvRankPools() const;
  std::unique_ptr<cuda_internal::Impl> impl_;
};

}  // namespace trident::backend

#endif  // TRIDENT_COMMON_BACKEND_CUDA_CUDA_BACKEND_H_
