#ifndef TRIDENT_KERNELS_CUDA_KV_APPEND_KV_APPEND_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_KV_APPEND_KV_APPEND_KERNEL_H_

// The launcher nvcc compiles; kv_append.cc checks arguments before calling it.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trident::kernels::cuda::internal {

// `vectorized`: head_dim, strides and cache offsets multiples of 8; base, k
// and v 16-byte aligned.
cudaError_t KvAppendBf16(void* base, int64_t num_blocks, int32_t block_size, int32_t num_kv_heads,
                         int32_t head_dim, int64_t block_stride_elems, int64_t value_offset_elems,
                         const void* k, int64_t k_stride, const void* v, int64_t v_stride,
                         const int64_t* slots, int64_t num_tokens, bool vectorized, bool pdl,
                         cudaStream_t stream);

// FP8 E4M3 cache (kv_append.h's PagedKvFp8Gpu); k and v bf16.
cudaError_t KvAppendFp8(void* base, int64_t num_blocks, int32_t block_size, int32_t num_kv_heads,
                        int32_t head_dim, int64_t block_stride_bytes, int64_t value_offset_bytes,
                        int64_t scale_offset_bytes, const void* k, int64_t k_stride, const void* v,
                        int64_t v_stride, const int64_t* slots, int64_t num_tokens, bool pdl,
                        cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_KV_APPEND_KV_APPEND_KERNEL_H_
