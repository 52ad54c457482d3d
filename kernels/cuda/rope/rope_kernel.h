#ifndef TRIDENT_KERNELS_CUDA_ROPE_ROPE_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_ROPE_ROPE_KERNEL_H_

// The launcher nvcc compiles; rope.cc checks arguments before calling it.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/kv_append/kv_slot.h"

namespace trident::kernels::cuda::internal {

// `paired`: head_dim % 4 == 0, both strides even, q and k 4-byte aligned.
cudaError_t RopeBf16(void* q, int64_t q_token_stride, int32_t num_q_heads, void* k,
                     int64_t k_token_stride, int32_t num_kv_heads, int32_t head_dim,
                     const int32_t* positions, int64_t num_tokens, const float* inv_freq,
                     bool paired, cudaStream_t stream);

// Rows of [q | k | v] fp32 in, bf16 out; q and k rotated; k and v also
// into `store`'s cache.
cudaError_t RopeQkvF32(const float* in, int64_t in_stride, void* out, int64_t out_stride,
                       int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                       const int32_t* positions, int64_t num_tokens, const float* inv_freq,
                       bool pdl, const KvSlotTarget& store, cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_ROPE_ROPE_KERNEL_H_
