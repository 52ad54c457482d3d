#ifndef TRIDENT_KERNELS_CUDA_GEMM_GEMM_SKINNY_SM90_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_GEMM_GEMM_SKINNY_SM90_KERNEL_H_

// Hopper's skinny GEMM (built for sm_90a alone): y[m, n] = x[m, k] · Wᵀ for
// a few rows x (2 <= m <= kSkinnyMaxRows, a decode step's batch), streaming
// W once through shared memory with the tensor copy engine and multiplying
// on wgmma with x as the narrow operand. gemm.cc checks the arguments and
// that the device is sm_90.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace trident::kernels::cuda::internal {

inline constexpr int64_t kSkinnyMaxRows = 64;

struct SkinnyArgs {
  const void* x = nullptr;  // bf16 [m][x_stride]
  int64_t x_stride = 0;
  const void* w = nullptr;  // bf16 [rows][k]: n rows, or 2 n with silu_mul
  const void* bias = nullptr;
  void* y = nullptr;  // [m][y_stride]
  int64_t y_stride = 0;
  int64_t m = 0;
  int64_t n = 0;  // outputs per row
  int64_t k = 0;
  bool f32_out = false;
  bool accumulate = false;
  // y = silu(x · W[0, n)ᵀ) * (x · W[n, 2n)ᵀ) in bf16 (the bias, when given,
  // f32 [2 n]); otherwise y (+)= x · Wᵀ (+ bias of y's dtype).
  bool silu_mul = false;
  // 64 or 128: W's rows per tile (128 halves the re-reads of x and doubles
  // the partial sums' size; silu_mul takes 128 alone: 64 gate and 64 up
  // rows).
  int tile_rows = 128;
  // With 128-row tiles and no fused SwiGLU: where the tiles fit one wave as
  // clusters of 4 (or 2) CTAs, each CTA takes a quarter (half) of its tile's
  // k and the cluster adds the shares in shared memory, instead of
  // stream-K's fix-ups through global memory.
  bool cluster_split = false;
  bool pdl = true;
};

// Device scratch: `partials` of SkinnyPartialBytes (no state between
// calls), `counters` of SkinnyCounterBytes, zero before the first call (the
// kernel leaves them zero).
struct SkinnyScratch {
  void* partials = nullptr;
  size_t partial_bytes = 0;
  int32_t* counters = nullptr;
  size_t counter_bytes = 0;
};

// Whether the kernel takes the shape: m in [2, kSkinnyMaxRows], k and
// x_stride multiples of 8, x and W 16-byte aligned, tile_rows as above.
bool SkinnySuits(const SkinnyArgs& args);

// The CTAs per cluster (4 or 2) that GemmSkinny runs `args` with on the
// calling thread's current device of `sms` SMs, or 0 where it shares the
// work stream-K style: without cluster_split, with 64-row tiles or the
// fused SwiGLU, or where the tiles do not fit one wave as clusters.
int SkinnyClusterSize(const SkinnyArgs& args, int sms);

// Scratch the call needs on a device of `sms` SMs.
size_t SkinnyPartialBytes(const SkinnyArgs& args, int sms);
size_t SkinnyCounterBytes(const SkinnyArgs& args);

// Enqueues the product; cudaErrorInvalidValue where SkinnySuits fails, the
// scratch is short or the driver cannot encode the tensor maps.
cudaError_t GemmSkinny(const SkinnyArgs& args, const SkinnyScratch& scratch, int sms,
                       cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_GEMM_GEMM_SKINNY_SM90_KERNEL_H_
