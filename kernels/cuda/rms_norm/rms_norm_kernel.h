#ifndef TRIDENT_KERNELS_CUDA_RMS_NORM_RMS_NORM_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_RMS_NORM_RMS_NORM_KERNEL_H_

// The launchers nvcc compiles; rms_norm.cc checks arguments before calling
// them. `vectorized`: dim and every stride a multiple of 4, fp32 pointers
// 16-byte and bf16 pointers 8-byte aligned.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trident::kernels::cuda::internal {

cudaError_t RmsNormBf16Out(const void* x, bool x_is_bf16, int64_t x_stride, const float* weight,
                           void* out, int64_t out_stride, int64_t rows, int64_t dim, float eps,
                           bool vectorized, bool pdl, cudaStream_t stream);

cudaError_t AddRmsNormBf16Out(float* residual, int64_t residual_stride, const void* delta,
                              int64_t delta_stride, bool replace_residual, const float* weight,
                              void* out, int64_t out_stride, int64_t rows, int64_t dim, float eps,
                              bool vectorized, bool pdl, cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_RMS_NORM_RMS_NORM_KERNEL_H_
