#ifndef TRIDENT_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_PAGED_PREFILL_ATTENTION_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_PAGED_PREFILL_ATTENTION_KERNEL_H_

// The launcher nvcc compiles; paged_prefill_attention.cc checks arguments
// before calling it. The fields mirror PagedPrefillArgs (whose header pulls in
// Abseil, which nvcc does not need to see).

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trident::kernels::cuda::internal {

struct PagedPrefillParams {
  const void* q;
  int64_t q_stride;
  void* out;
  int64_t out_stride;
  const void* kv_base;
  bool kv_fp8;  // FP8 E4M3 in kernels/cpu/paged_kv_fp8's layout; offsets in bytes.
  int64_t block_stride_elems;
  int64_t value_offset_elems;
  int64_t scale_offset_elems;
  int32_t block_size;
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  const int32_t* block_tables;
  int32_t max_blocks_per_seq;
  const int32_t* context_lens;
  const int32_t* query_lens;
  const int32_t* query_starts;
  int32_t batch;
  int32_t max_query_len;
  float scale;
};

// Hopper's wgmma kernel (paged_prefill_attention_sm90.cu, built for sm_90a).
// Supports: head_dim 128, with the bf16 cache, or the FP8 cache when its
// blocks lie whole 128-byte rows apart and the block size divides 128.
bool PagedPrefillSm90Supports(const PagedPrefillParams& params);
// REQUIRES: as PagedPrefillAttention, PagedPrefillSm90Supports(params), and
// an sm_90 device.
cudaError_t PagedPrefillAttentionSm90(const PagedPrefillParams& params, cudaStream_t stream);

// REQUIRES: the checks of LaunchPagedPrefillAttention passed; batch > 0 and
// max_query_len > 0.
cudaError_t PagedPrefillAttention(const PagedPrefillParams& params, cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_PAGED_PREFILL_ATTENTION_KERNEL_H_
