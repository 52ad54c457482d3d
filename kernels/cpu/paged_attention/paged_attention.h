// Attention over a paged KV cache, on the CPU: the KV append that stores a
// step's keys and values, and causal grouped-query attention for a batch of
// sequences that mixes decode steps, prefills and prefill chunks.
//
// Cache layout for one layer. Block b (a physical block id) starts at
//   base + b * block_stride_elems
// and holds keys then, `value_offset_elems` further on, values, each in
// HEAD_TOKEN_DIM order:
//
//   K of block b:  [num_kv_heads][block_size][head_dim]
//   V of block b:  [num_kv_heads][block_size][head_dim]  (+ value_offset_elems)
//
// so element (kv head h, token t of the block, dim d) of K sits at
//   base + b * block_stride_elems + (h * block_size + t) * head_dim + d.
// Token position p of a sequence lives in block block_table[p / block_size],
// slot p % block_size. Elements are fp32 or bf16; all math is fp32.

#ifndef TRIDENT_KERNELS_CPU_PAGED_ATTENTION_PAGED_ATTENTION_H_
#define TRIDENT_KERNELS_CPU_PAGED_ATTENTION_PAGED_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/numeric/dtype.h"

namespace trident::kernels::cpu {

// One layer's view of the paged KV cache. Offsets and strides count elements
// of `dtype`, not bytes.
struct PagedKv {
  void* base = nullptr;
  numeric::DType dtype = numeric::DType::kBF16;  // kF32 or kBF16.
  int32_t block_size = 16;                       // Tokens per block.
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t block_stride_elems = 0;  // From block b to block b + 1.
  int64_t value_offset_elems = 0;  // From a block's K to its V.
};

// OK, or kInvalidArgument naming the field: a non-null base, dtype kF32 or
// kBF16, positive block_size, num_kv_heads and head_dim, and strides under
// which one block's K and V ([num_kv_heads * block_size * head_dim] each)
// overlap neither each other nor the next block.
absl::Status ValidatePagedKv(const PagedKv& kv);

// Stores the keys and values of `num_tokens` tokens. Token i's K row (all kv
// heads, [num_kv_heads * head_dim]) is at k + i * k_stride, its V row at
// v + i * v_stride; it goes to slot slots[i], i.e. block slots[i] / block_size,
// offset slots[i] % block_size. A negative slot (padding) is skipped. bf16
// caches get round-to-nearest-even.
// REQUIRES: ValidatePagedKv(kv).ok(); slots distinct and inside the cache.
void AppendKv(const PagedKv& kv, const float* k, int64_t k_stride, const float* v, int64_t v_stride,
              const int64_t* slots, int64_t num_tokens);

// One sequence of the batch.
struct AttentionSequence {
  const int32_t* block_table = nullptr;  // Physical block of each block_size positions.
  int32_t context_len = 0;               // Tokens in the cache, this step's included.
  int32_t query_len = 0;                 // This step's tokens: the last query_len positions.
  int64_t query_row = 0;                 // Their first row in q and out.
};

// For every sequence s and its query token j (position
// p = context_len - query_len + j, row query_row + j), and every q head h:
//
//   out[row, h] = softmax_{t <= p}(scale * q[row, h] . K[t, h / group]) . V[., h / group]
//
// with group = num_q_heads / num_kv_heads (grouped-query attention). Row r of
// q holds num_q_heads * head_dim floats at q + r * q_stride (q may be a fused
// qkv row); out likewise at out + r * out_stride. The softmax is computed
// online in fp32 (running max and sum). Work is spread over the calling
// thread's OpenMP threads by (sequence, kv head, query tile), and for long
// contexts with too little such work also by context chunk (split-K, merged
// exactly); a decode step processes all q heads of a kv head together so each
// cached element is read once.
//
// REQUIRES: ValidatePagedKv(kv).ok(); num_q_heads a positive multiple of
// num_kv_heads; 1 <= query_len <= context_len; block tables cover
// context_len positions of blocks already written; query rows of different
// sequences distinct; out does not overlap q or the cache.
void PagedAttention(const PagedKv& kv, const float* q, int64_t q_stride, int32_t num_q_heads,
                    absl::Span<const AttentionSequence> seqs, float scale, float* out,
                    int64_t out_stride);

}  // namespace trident::kernels::cpu

#endif  // TRIDENT_KERNELS_CPU_PAGED_ATTENTION_PAGED_ATTENTION_H_
