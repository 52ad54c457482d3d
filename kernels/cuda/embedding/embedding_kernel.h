#ifndef TRIDENT_KERNELS_CUDA_EMBEDDING_EMBEDDING_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_EMBEDDING_EMBEDDING_KERNEL_H_

// The launcher nvcc compiles; embedding.cc checks arguments before calling it.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trident::kernels::cuda::internal {

// `vectorized`: hidden % 8 == 0 and table and out 16-byte aligned.
cudaError_t EmbeddingBf16(const int32_t* token_ids, int64_t num_tokens, const void* table,
                          int64_t vocab, int64_t hidden, void* out, bool vectorized,
                          cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_EMBEDDING_EMBEDDING_KERNEL_H_
