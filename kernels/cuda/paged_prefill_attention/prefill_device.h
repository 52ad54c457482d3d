#ifndef TRIDENT_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_PREFILL_DEVICE_H_
#define TRIDENT_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_PREFILL_DEVICE_H_

// Device helpers the two prefill kernels share (nvcc only): cp.async and
// bf16 packing.

#include <cuda_bf16.h>

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

// Packs two floats as bf16x2, `lo` in the low half (the lower column index).
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace trident::kernels::cuda::internal::prefill

#endif  // TRIDENT_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_PREFILL_DEVICE_H_
