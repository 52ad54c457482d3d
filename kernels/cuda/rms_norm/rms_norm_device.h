#ifndef TRIDENT_KERNELS_CUDA_RMS_NORM_RMS_NORM_DEVICE_H_
#define TRIDENT_KERNELS_CUDA_RMS_NORM_RMS_NORM_DEVICE_H_

// The arithmetic of the RMSNorm kernels, for nvcc only (a .cu file's
// include), shared with kernels that fuse the norm ahead of their own work
// (Hopper's GEMV) so that both give the same bits: the block size over a
// row, the sum of squares' order (each thread's elements, then a butterfly
// within each warp, then one over the warps' sums), r and the scaling.

#include <cstdint>

namespace trident::kernels::cuda::rms_norm {

// Threads of a block over `units` (elements, or 4-element vectors): one
// each, a multiple of 32, at most 512.
__host__ __device__ constexpr int BlockThreads(int64_t units) {
  return units >= 512 ? 512 : static_cast<int>((units + 31) / 32 * 32);
}

// The butterfly sum of a warp's values, in every lane.
__device__ __forceinline__ float WarpButterflySum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// 1 / sqrt(mean + eps) with IEEE-rounded division and square root, as the
// CPU computes it.
__device__ __forceinline__ float InverseRms(float sum_squares, int64_t dim, float eps) {
  const float variance = __fdiv_rn(sum_squares, static_cast<float>(dim));
  return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(variance, eps)));
}

// One normed element before its rounding to bf16: weight * (x * r).
__device__ __forceinline__ float Scaled(float x, float weight, float r) {
  return __fmul_rn(weight, __fmul_rn(x, r));
}

}  // namespace trident::kernels::cuda::rms_norm

#endif  // TRIDENT_KERNELS_CUDA_RMS_NORM_RMS_NORM_DEVICE_H_
