// The executable spec for PagedAttention (paged_attention.h): gather each
// sequence's keys and values into contiguous arrays through its block table,
// then textbook causal softmax attention in double. For tests only.

#ifndef TRIDENT_KERNELS_CPU_PAGED_ATTENTION_PAGED_ATTENTION_REFERENCE_H_
#define TRIDENT_KERNELS_CPU_PAGED_ATTENTION_PAGED_ATTENTION_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "kernels/cpu/paged_attention/paged_attention.h"

namespace trident::kernels::cpu {

// The cached element (position `pos` of the sequence whose block table is
// `block_table`, kv head `head`, dim `dim`) of K (`value` false) or V, as float.
float ReadCachedElement(const PagedKv& kv, const int32_t* block_table, int32_t pos, int32_t head,
                        int32_t dim, bool value);

// Same contract as PagedAttention.
void PagedAttentionReference(const PagedKv& kv, const float* q, int64_t q_stride,
                             int32_t num_q_heads, absl::Span<const AttentionSequence> seqs,
                             float scale, float* out, int64_t out_stride);

}  // namespace trident::kernels::cpu

#endif  // TRIDENT_KERNELS_CPU_PAGED_ATTENTION_PAGED_ATTENTION_REFERENCE_H_
