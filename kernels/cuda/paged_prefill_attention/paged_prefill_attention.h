// Causal prefill attention over the paged KV cache on the GPU, with tensor
// cores, for a variable-length batch of sequences (whole prefills and prefill
// chunks alike). bf16 in and out, fp32 softmax and accumulation.
//
// Each sequence s has context_lens[s] tokens in the cache, this step's
// included; its query_lens[s] query tokens are the LAST query_lens[s]
// positions. Query token j of s (position p = context_len - query_len + j)
// sits at row query_starts[s] + j of q and out, and for every q head h:
//
//   out[row, h] = softmax_{t <= p}(scale * q[row, h] . K[t, h / group]) . V[., h / group]
//
// with group = num_q_heads / num_kv_heads (grouped-query attention). This is
// the contract of kernels/cpu/paged_attention's PagedAttention, which is the
// reference.
//
// Cache layout (one layer; see kernels/cpu/paged_attention/paged_attention.h):
// block b's K is [num_kv_heads][block_size][head_dim] bf16 at
// kv_base + b * block_stride_elems, its V value_offset_elems further on.
// Position t of sequence s lives in block block_tables[s * max_blocks_per_seq
// + t / block_size], slot t % block_size.
//
// The kernel (FlashAttention-2 style) runs one CTA per (query tile of 64 or
// 128 rows, q head, sequence). It walks the sequence's KV in tiles of 64
// tokens, gathered through the block table into shared memory with cp.async
// (double-buffered), computes S = Q.K^T and O += P.V with mma.sync bf16
// tensor-core instructions, and keeps the softmax online in fp32. Only the
// tiles that cross the causal diagonal (or the end of the context) are
// masked; tiles entirely above it are never loaded.
//
// The kernel takes raw device pointers and a stream, never allocates and
// never synchronizes.

#ifndef TRIDENT_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_PAGED_PREFILL_ATTENTION_H_
#define TRIDENT_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_PAGED_PREFILL_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace trident::kernels::cuda {

// Which kernel runs: kAuto takes Hopper's wgmma kernel
// (paged_prefill_attention_sm90.cu) where it applies (an sm_90 device,
// head_dim 128; the bf16 cache, or the FP8 cache in blocks of at most 128
// tokens whose K and V start on 128-byte boundaries, as
// kernels/cpu/paged_kv_fp8's dense layout does) and the mma.sync kernel
// otherwise.
enum class PrefillKernel { kAuto, kMmaSync, kWgmma };

struct PagedPrefillArgs {
  // Device pointer, bf16 [total_q_tokens][num_q_heads * head_dim], row stride
  // q_stride elements (>= num_q_heads * head_dim; q may be a fused qkv row).
  const void* q = nullptr;
  int64_t q_stride = 0;
  // Device pointer, bf16, same row indexing as q with row stride out_stride.
  // Only the rows of query tokens are written.
  void* out = nullptr;
  int64_t out_stride = 0;
  // Device pointer to the layer's bf16 KV cache (layout above), or with
  // kv_fp8 its FP8 E4M3 cache in kernels/cpu/paged_kv_fp8's layout (offsets
  // in bytes; the scales scale_offset_elems from each block's start;
  // block_size a multiple of 16): its K and V are turned into bf16 as they
  // are loaded.
  const void* kv_base = nullptr;
  bool kv_fp8 = false;
  int64_t block_stride_elems = 0;
  int64_t value_offset_elems = 0;
  int64_t scale_offset_elems = 0;
  int32_t block_size = 16;  // Tokens per block.
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;  // A multiple of 16 in [16, 256] (64, 128, 256 unmasked).
  // Device pointer, int32 [batch][max_blocks_per_seq].
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
  // Device pointers, int32 [batch] each.
  const int32_t* context_lens = nullptr;
  const int32_t* query_lens = nullptr;
  const int32_t* query_starts = nullptr;  // First row of each sequence in q and out.
  int32_t batch = 0;
  // Host-side upper bound on every query_lens[s]; sizes the grid.
  int32_t max_query_len = 0;
  float scale = 1.0f;  // Usually 1 / sqrt(head_dim).
  PrefillKernel kernel = PrefillKernel::kAuto;
};

// Enqueues the kernel on `stream` and returns without waiting.
//
// kInvalidArgument (and no launch) naming the field for: head_dim not a
// multiple of 16 in [16, 256]; non-positive block_size, num_q_heads or num_kv_heads;
// num_q_heads not a multiple of num_kv_heads; q_stride or out_stride smaller
// than a row or not a multiple of 8; block_stride_elems or value_offset_elems
// not a multiple of 8 or letting one block's K and V overlap each other or
// the next block; null pointers or pointers not 16-byte aligned (q, out,
// kv_base) when there is work; negative batch, max_query_len or
// max_blocks_per_seq; kernel kWgmma with a head_dim other than 128 or an
// FP8 cache it does not take. kFailedPrecondition for kWgmma on a device
// other than sm_90.
// kInternal if the launch fails. batch == 0 or
// max_query_len == 0 is a no-op.
//
// REQUIRES (device data, not checkable without a sync): for every s,
// 1 <= query_lens[s] <= min(context_lens[s], max_query_len) (a sequence with
// query_lens[s] == 0 is skipped); context_lens[s] <= max_blocks_per_seq *
// block_size; the block table entries covering context_lens[s] positions
// name blocks inside the cache, already written; query rows of different
// sequences distinct; out overlaps neither q nor the cache.
absl::Status LaunchPagedPrefillAttention(const PagedPrefillArgs& args, cudaStream_t stream);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_PAGED_PREFILL_ATTENTION_PAGED_PREFILL_ATTENTION_H_
