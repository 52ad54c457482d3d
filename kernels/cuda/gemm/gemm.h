// Linear layers on the GPU through cuBLASLt: y[m, n] = x[m, k] · Wᵀ (+ bias)
// (+ y) with W in Hugging Face layout [n][k] row-major, x and W bf16, fp32
// accumulation (CUBLAS_COMPUTE_32F), y bf16 or fp32. The bias, when given, is
// fused into the matmul as a cuBLASLt epilogue; `accumulate` adds the product
// to y's old contents (beta = 1), which is how projections add straight into
// an fp32 residual stream. The reference is kernels/cpu/linear.
//
// A single row of x (one sequence's decode step) takes a weight-streaming
// GEMV kernel of this package instead (GemmOptions::gemv), where the shape
// suits it (k a multiple of 8 and at most 8192, x and W 16-byte aligned): it
// reads a single token's smaller projections faster than cuBLASLt does.

#ifndef TRIDENT_KERNELS_CUDA_GEMM_GEMM_H_
#define TRIDENT_KERNELS_CUDA_GEMM_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/numeric/dtype.h"
#include "kernels/cuda/kv_append/kv_append.h"

namespace trident::kernels::cuda {

struct GemmArgs {
  // Device pointers: x [m][k] (row stride x_stride), w [n][k] (contiguous),
  // optional bias [n] (of y_dtype, may be null), y [m][n] (row stride
  // y_stride, of y_dtype).
  const void* x = nullptr;
  int64_t x_stride = 0;
  const void* w = nullptr;
  const void* bias = nullptr;
  void* y = nullptr;
  int64_t y_stride = 0;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  // kBF16 or kF32.
  numeric::DType y_dtype = numeric::DType::kBF16;
  // y += x·Wᵀ (+ bias) instead of y = ...
  bool accumulate = false;
  // An RMSNorm fused ahead of the product, where Gemm::FusesNorm (non-null
  // elsewhere: kFailedPrecondition): x is then the f32 row [k] (the
  // residual stream) and the product takes bf16(norm_weight * (x * r)),
  // r = 1 / sqrt(mean(x²) + norm_eps), the bits kernels/cuda/rms_norm
  // writes, so the norm needs no kernel of its own. norm_weight: f32 [k],
  // 16-byte aligned.
  const float* norm_weight = nullptr;
  float norm_eps = 0;
};

// RoPE in a q/k/v projection's epilogue (Gemm::RunRope): one token at
// positions[0] (device), inv_freq [head_dim / 2] (device), its q and k
// heads rotated as kernels/cuda/rope's RopeQkvF32 rotates them.
struct GemmRope {
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  // Optional (kv.base null: not stored): k and v also stored at slots[0]
  // (device) of this bf16 paged KV cache, where kernels/cuda/kv_append's
  // LaunchKvAppend stores them (a slot outside the cache: not stored); its
  // heads and head_dim are the ones above (ValidateKvStore).
  PagedKvBf16 kv;
  const int64_t* slots = nullptr;
};

struct GemmOptions {
  // Device memory for cuBLASLt, allocated once (32 MiB, as cuBLAS
  // recommends for Hopper).
  size_t workspace_bytes = size_t{32} << 20;
  // Single-row calls take the GEMV kernel; false sends every call to
  // cuBLASLt (the benchmark's peer). Only one row: from two rows on, CUDA
  // 13's cuBLASLt streams the weights as fast as for one, and a GEMV kernel
  // for 2-16 rows measured slower (bench/RESULTS.md).
  bool gemv = true;
  // Launch the GEMV kernel with programmatic dependent launch: it loads its
  // first weights while the kernel before it finishes (kernels of this
  // project that precede projections let it: norms, the activation,
  // decode attention).
  bool pdl = true;
  // On sm_90, the single-row calls take Hopper's GEMV, which streams the
  // weights through shared memory with the bulk copy engine, for any k;
  // false keeps the register-streaming GEMV (k up to 8192, cuBLASLt beyond).
  bool gemv_bulk = true;
  // Hopper's GEMV hands out W's items (8 rows) to its CTAs as they ask
  // (a counter per launch) instead of a fixed run each, so a CTA that
  // starts late (behind the kernel ahead) or reads slowly takes fewer and
  // the grid ends together.
  bool gemv_dynamic = true;
  // On sm_90, calls of 2 to 64 rows (a decode step's batch) take Hopper's
  // skinny GEMM: W streamed once by the tensor copy engine, multiplied on
  // wgmma with x as the narrow operand, k split across CTAs (launched with
  // programmatic dependent launch when `pdl`). Off by default: on the H200
  // it read the 8B shapes' q/k/v, o and down projections at 0.30-0.78 of
  // the ceiling against cuBLASLt's 0.47-0.82, and led only on gate/up and
  // the LM head (bench/RESULTS.md).
  bool skinny = false;
  // Without `skinny`, the fused gate/up + SwiGLU (RunSiluMul) of 2 up to
  // this many rows still takes it, where it measured ahead: 63.0 µs for
  // the 8B shape at 16 rows against cuBLASLt's 64.1 µs before the separate
  // activation kernel (0.87 of the ceiling); in a decode step at 32 and 64
  // rows the step was 2.1% and 0.9% shorter than with cuBLASLt and the
  // activation kernel (bench/RESULTS.md). 0 or 1: never.
  int64_t skinny_silu_max_rows = 64;
  // Its W rows per tile, 64 or 128 (128 halves x's re-reads from L2 and
  // doubles the partial sums of split tiles; the fused SwiGLU takes 128).
  int skinny_tile_rows = 128;
  // With 128-row tiles: a call whose tiles fit one wave as clusters of 4 (or
  // 2) CTAs splits each tile's k within its cluster and adds the shares in
  // the cluster's shared memory (o and down at the 8B shape: 32 tiles of
  // 4 CTAs; on an H200 clusters of 4 do not fit one wave, so pairs),
  // instead of stream-K's fix-ups through global memory. Off by default: at
  // 8-16 rows it beat cuBLASLt alone (o 12.5 against 15.7 µs) but in a
  // decode step only q/k/v gained (bench/RESULTS.md).
  bool skinny_cluster_split = false;
  // cuBLASLt's calls: up to this many of its heuristic's candidates are
  // timed for each shape first planned while the call's stream is being
  // captured into a CUDA graph (a decode step's shapes, captured at
  // start-up), and the fastest is kept for that shape from then on. Each
  // runs on a stream of its own into scratch memory, reading x, W and the
  // bias as given. 0 or 1: the heuristic's first choice for every shape.
  // Shapes first planned outside a capture always take the first choice,
  // so that nothing is timed while serving.
  int tune_algos = 0;
  // The tuning's scratch output; a shape whose y needs more takes the
  // heuristic's first choice.
  size_t tune_scratch_bytes = size_t{64} << 20;
};

// One cuBLASLt handle and workspace, used from one thread (or externally
// serialized); the stream is per call. Algorithms are chosen per (m, n, k,
// strides, bias, output type) by cuBLASLt's heuristic, or by timing its
// candidates (GemmOptions::tune_algos), and cached.
class Gemm {
 public:
  // kFailedPrecondition without cuBLASLt; kResourceExhausted without memory
  // for the workspace.
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(const GemmOptions& options = {});
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Enqueues y = x·Wᵀ (+ bias) on `stream`. kInvalidArgument for bad shapes,
  // strides or null pointers; kInternal when cuBLASLt fails or has no
  // algorithm. m == 0 is a no-op.
  absl::Status Run(const GemmArgs& args, cudaStream_t stream);

  // What GemmOptions::tune_algos did so far: shapes timed, those whose
  // fastest candidate was not the heuristic's first choice, and the time
  // spent.
  struct TuneStats {
    int shapes = 0;
    int changed = 0;
    double seconds = 0;
  };
  TuneStats tune_stats() const;

  // A gate/up projection with SwiGLU's activation as its epilogue: W [n][k]
  // holds the n/2 gate rows, then the n/2 up rows; y [m][y_stride] gets
  // silu(g_j) * u_j for j < n/2, in bf16 (the bias, when given, is f32 [n]
  // and added to g and u). One kernel where FusesSiluMul (calls that take
  // Hopper's GEMV or skinny GEMM); kFailedPrecondition elsewhere (the
  // caller runs Run into f32 and then kernels/cuda/silu_mul, which computes
  // the same values). kInvalidArgument for bad shapes or null pointers.
  bool FusesSiluMul(const GemmArgs& args) const;
  absl::Status RunSiluMul(const GemmArgs& args, cudaStream_t stream);

  // One token's fused q/k/v projection with RoPE as its epilogue: y (bf16,
  // n = (num_q_heads + 2 * num_kv_heads) * head_dim) gets q and k rotated
  // and v, the bits of Run into f32 followed by kernels/cuda/rope's
  // LaunchRopeQkv; the bias, when given, is f32 [n]. One kernel where
  // FusesRope (one row on Hopper's GEMV, head_dim a multiple of 8, y bf16,
  // no accumulate); kFailedPrecondition elsewhere. The norm fuses as in Run.
  bool FusesRope(const GemmArgs& args, const GemmRope& rope) const;
  absl::Status RunRope(const GemmArgs& args, const GemmRope& rope, cudaStream_t stream);

  // Whether Run and RunSiluMul take `args` with its norm fused: one row
  // on Hopper's GEMV, k at most internal::GemvBulkNormMaxK() (8624), x and
  // norm_weight 16-byte aligned.
  bool FusesNorm(const GemmArgs& args) const;

  // The CTAs per cluster (4 or 2) where Run takes the skinny GEMM split in
  // clusters for `args` (GemmOptions::skinny_cluster_split, on the calling
  // thread's current device); 0 where it does not. For tests and
  // benchmarks: which kernel a call gets.
  int SkinnyClusterSize(const GemmArgs& args) const;

 private:
  struct Impl;
  explicit Gemm(std::unique_ptr<Impl> impl);
  // kFailedPrecondition for a norm that does not fuse.
  absl::Status CheckNorm(const GemmArgs& args) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_GEMM_GEMM_H_
