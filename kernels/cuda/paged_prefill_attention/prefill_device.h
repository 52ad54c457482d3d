#ifndef TRIDENT_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_PREFILL_DEVICE_H_
#define TRIDENT_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_PREFILL_DEVICE_H_

// Device helpers the two prefill kernels share (nvcc only): cp.async, bf16
// packing and the online softmax's running max.

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

namespace trident::kernels::cuda::internal::prefill {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies 16 bytes, or writes 16 zero bytes when !valid (no global read then).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_size));
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_all;\n" ::); }

// Packs two floats as bf16x2, `lo` in the low half (the lower column index).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Joins a tile into a row's running max, the row's columns spread over the
// 4 threads of a quad (mma's accumulator fragment): `tile_max` is this
// thread's max over its columns of the tile, in score units; `row_max` is in
// log2 units (scores x scale_log2). Returns the shift the row's
// exponentials subtract, and sets `alpha`, the factor the row's earlier sum
// and output are rescaled by.
__device__ __forceinline__ float UpdateRowMax(float tile_max, float scale_log2, float& row_max,
                                              float& alpha) {
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
  const float new_max = fmaxf(row_max, tile_max * scale_log2);
  // A row with nothing visible yet keeps max -inf; shifting by 0 then keeps
  // exp2(-inf) == 0 instead of NaN.
  const float shift = new_max == -INFINITY ? 0.0f : new_max;
  alpha = exp2f(row_max - shift);
  row_max = new_max;
  return shift;
}

}  // namespace trident::kernels::cuda::internal::prefill

#endif  // TRIDENT_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_PREFILL_DEVICE_H_
