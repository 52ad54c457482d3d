#ifndef TRIDENT_KERNELS_CUDA_GEMM_GEMV_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_GEMM_GEMV_KERNEL_H_

// The small-m launcher nvcc compiles; gemm.cc checks arguments (and that the
// shapes suit it: GemvSuits) before calling it.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trident::kernels::cuda::internal {

// Rows of x the GEMV kernel takes at most (one template instance each).
inline constexpr int64_t kGemvMaxM = 16;

// y[m][n] (+)= x[m][k] · Wᵀ (+ bias), W [n][k] bf16 row-major, x bf16 with
// row stride x_stride, y and bias fp32 (f32_out) or bf16. 1 <= m <=
// kGemvMaxM; k, x_stride a multiple of 8 and x, w 16-byte aligned. With
// `pdl` the kernel is launched with programmatic dependent launch (it loads
// its first weights before waiting for the previous kernel to end).
cudaError_t GemvBf16(const void* x, int64_t x_stride, const void* w, const void* bias, void* y,
                     int64_t y_stride, int64_t m, int64_t n, int64_t k, bool f32_out,
                     bool accumulate, bool pdl, cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_GEMM_GEMV_KERNEL_H_
