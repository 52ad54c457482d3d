// Attention over a paged KV cache on the CPU, for prefill (many causal query
// tokens per sequence, possibly a later chunk of a prompt) and decode (one
// query token per sequence) alike, with grouped-query attention.
//
// KV layout of one layer (trident.v1.KvLayout, KV_BLOCK_LAYOUT_HEAD_TOKEN_DIM):
// block b's K entries start at base + b * block_stride_elems, its V entries
// value_offset_elems after that; each is [num_kv_heads][block_size][head_dim].

#ifndef TRIDENT_KERNELS_CPU_PAGED_ATTENTION_PAGED_ATTENTION_H_
#define TRIDENT_KERNELS_CPU_PAGED_ATTENTION_PAGED_ATTENTION_H_

#include <cstdint>

#include "absl/types/span.h"
#include "common/numeric/dtype.h"

namespace trident::kernels::cpu {

// One layer's paged KV. Elements are kF32 or kBF16.
struct PagedKv {
  void* base = nullptr;
  numeric::DType dtype = numeric::DType::kF32;
  int32_t block_size = 16;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t block_stride_elems = 0;
  int64_t value_offset_elems = 0;
};

// Writes the K and V rows of `num_tokens` tokens ([num_kv_heads * head_dim]
// each, rows `k_stride` / `v_stride` floats apart) into their slots: slot s is
// block s / block_size, offset s % block_size. bf16 caches round to nearest
// even.
void AppendKv(const PagedKv& kv, const float* k, int64_t k_stride, const float* v,
              int64_t v_stride, const int64_t* slots, int64_t num_tokens);

// One sequence of the batch.
struct AttentionSequence {
  // Block ids covering positions [0, context_len).
  const int32_t* block_table = nullptr;
  // Tokens in the KV cache, this step's included.
  int32_t context_len = 0;
  // This step's query tokens: the last query_len positions of the context.
  int32_t query_len = 0;
  // Row of the first query token in q and out.
  int64_t query_row = 0;
};

// out[row, h*head_dim ...] = softmax(scale * q·Kᵀ) V for every query row and
// head, causal (query token j of a sequence sees positions up to
// context_len - query_len + j). Query head h reads KV head
// h / (num_q_heads / num_kv_heads). q and out rows are [num_q_heads * head_dim]
// at strides q_stride / out_stride. Computes in fp32 with an online softmax;
// parallel over (sequence, KV head, query tile) with OpenMP, each KV block
// read once per tile for all the query heads that share it.
// REQUIRES: num_q_heads % num_kv_heads == 0; 1 <= query_len <= context_len.
void PagedAttention(const PagedKv& kv, const float* q, int64_t q_stride, int32_t num_q_heads,
                    absl::Span<const AttentionSequence> seqs, float scale, float* out,
                    int64_t out_stride);

// The plain reference: gathers each sequence's KV and runs textbook softmax
// attention in double.
void PagedAttentionReference(const PagedKv& kv, const float* q, int64_t q_stride,
                             int32_t num_q_heads, absl::Span<const AttentionSequence> seqs,
                             float scale, float* out, int64_t out_stride);

}  // namespace trident::kernels::cpu

#endif  // TRIDENT_KERNELS_CPU_PAGED_ATTENTION_PAGED_ATTENTION_H_
