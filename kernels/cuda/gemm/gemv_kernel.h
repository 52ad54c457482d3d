#ifndef TRIDENT_KERNELS_CUDA_GEMM_GEMV_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_GEMM_GEMV_KERNEL_H_

// The single-row launcher nvcc compiles; gemm.cc checks arguments (and that
// the shapes suit it: GemvSuits) before calling it.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trident::kernels::cuda::internal {

// y[n] (+)= x[k] · Wᵀ (+ bias) for one row x, W [n][k] bf16 row-major, y and
// bias fp32 (f32_out) or bf16; k a multiple of 8, x and w 16-byte aligned.
// With `pdl` the kernel is launched with programmatic dependent launch (it
// loads its first weights before waiting for the previous kernel to end).
cudaError_t GemvBf16(const void* x, const void* w, const void* bias, void* y, int64_t n, int64_t k,
                     bool f32_out, bool accumulate, bool pdl, cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_GEMM_GEMV_KERNEL_H_
