#ifndef TRIDENT_KERNELS_CUDA_BLOCK_COPY_BLOCK_COPY_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_BLOCK_COPY_BLOCK_COPY_KERNEL_H_

// The launcher nvcc compiles; block_copy.cc checks arguments first.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trident::kernels::cuda::internal {

cudaError_t BlockCopy(const void* const* src, void* const* dst, int64_t num_blocks,
                      int64_t block_bytes, cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_BLOCK_COPY_BLOCK_COPY_KERNEL_H_
