#ifndef TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_PAGED_DECODE_ATTENTION_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_PAGED_DECODE_ATTENTION_KERNEL_H_

// The launcher nvcc compiles; paged_decode_attention.cc checks arguments
// before calling it.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trident::kernels::cuda::internal {

struct DecodeKernelParams {
  const void* q = nullptr;  // bf16
  int64_t q_stride = 0;
  void* out = nullptr;  // bf16
  int64_t out_stride = 0;
  const void* kv = nullptr;  // bf16
  int64_t block_stride = 0;
  int64_t value_offset = 0;
  int32_t block_size = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t group = 0;
  int32_t head_dim = 0;
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
  const int32_t* context_lens = nullptr;
  int32_t batch = 0;
  int32_t num_splits = 1;
  float scale_log2 = 0.0f;         // scale * log2(e): scores live in base 2.
  float* partial_out = nullptr;    // Null with one split.
  float* partial_stats = nullptr;  // (max, sum) pairs; null with one split.
};

// Launches the split kernel and, with more than one split, the merge kernel.
cudaError_t PagedDecodeBf16(const DecodeKernelParams& params, cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_PAGED_DECODE_ATTENTION_KERNEL_H_
