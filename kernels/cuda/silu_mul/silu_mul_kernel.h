#ifndef TRIDENT_KERNELS_CUDA_SILU_MUL_SILU_MUL_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_SILU_MUL_SILU_MUL_KERNEL_H_

// The launcher nvcc compiles; silu_mul.cc checks arguments before calling it.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trident::kernels::cuda::internal {

cudaError_t SiluMulBf16(const void* gate_up, int64_t gate_up_stride, bool f32_in, void* out,
                        int64_t out_stride, int64_t num_tokens, int64_t hidden, bool pdl,
                        cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_SILU_MUL_SILU_MUL_KERNEL_H_
