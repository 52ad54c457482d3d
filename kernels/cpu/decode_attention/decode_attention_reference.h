// The executable spec for DecodeAttention (decode_attention.h): textbook
// softmax attention in double over the layout, one element at a time. For
// tests only.

#ifndef TRIDENT_KERNELS_CPU_DECODE_ATTENTION_DECODE_ATTENTION_REFERENCE_H_
#define TRIDENT_KERNELS_CPU_DECODE_ATTENTION_DECODE_ATTENTION_REFERENCE_H_

#include <cstdint>

#include "absl/types/span.h"
#include "kernels/cpu/decode_attention/decode_attention.h"

namespace trident::kernels::cpu {

// Element (token, kv head, dim) of K (`value` false) or V of the
// sequence-layer at `kv`, as float.
float ReadDecodeKvElement(const DecodeKvLayout& layout, const void* kv, int32_t token,
                          int32_t head, int32_t dim, bool value);

// Same contract as Plan + Run + Merge: writes every sequence's o and, where
// non-null, lse. No validation.
void DecodeAttentionReference(const DecodeKvLayout& layout, int32_t num_q_heads, float scale,
                              absl::Span<const DecodeSequence> seqs);

}  // namespace trident::kernels::cpu

#endif  // TRIDENT_KERNELS_CPU_DECODE_ATTENTION_DECODE_ATTENTION_REFERENCE_H_
