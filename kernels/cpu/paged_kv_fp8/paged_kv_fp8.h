// The FP8 E4M3 paged KV cache: its layout, and the reference append and read
// the GPU kernels (kernels/cuda/kv_append, kernels/cuda/paged_decode_attention)
// are tested against.
//
// Every element is stored as FP8 E4M3 divided by a scale kept per token and
// KV head (for K and V apart): the row's largest magnitude over 448
// (numeric::Fp8E4M3Scale), so each row uses the format's whole range and
// nothing needs calibrating. One layer's block b starts at
//   base + b * block_stride_bytes
// and holds:
//
//   K       [num_kv_heads][block_size][head_dim]          e4m3
//   V       [num_kv_heads][block_size / 16][head_dim][16] e4m3 (+ value_offset_bytes)
//   scales  [2][num_kv_heads][block_size]                 f32  (+ scale_offset_bytes)
//
// V is transposed in groups of 16 tokens, and the 16 elements of each K
// row's 16-dim group and of each V row's 16-token group are stored in the
// order of the tensor cores' fragments: index i of the group sits at byte
// Fp8FragmentPosition(i), so that the 4 bytes at 4 * l hold indices 2l,
// 2l + 1, 2l + 8 and 2l + 9, which is what lane quad l of an m16n8k16 MMA
// needs for its two B registers. The scales hold K's ([0]) then V's ([1]).
// block_size must be a multiple of 16 and head_dim of 16.

#ifndef TRIDENT_KERNELS_CPU_PAGED_KV_FP8_PAGED_KV_FP8_H_
#define TRIDENT_KERNELS_CPU_PAGED_KV_FP8_PAGED_KV_FP8_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/numeric/fp8_fragment.h"

namespace trident::kernels::cpu {

struct PagedKvFp8 {
  void* base = nullptr;
  int32_t block_size = 16;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t block_stride_bytes = 0;
  int64_t value_offset_bytes = 0;
  int64_t scale_offset_bytes = 0;
};

// Byte position within its group of 16 of group index i in [0, 16).
using numeric::Fp8FragmentPosition;

// The packed layout's offsets: K at 0, V right after it, the scales after V
// (16-byte aligned), and the block stride (a multiple of 16).
PagedKvFp8 DensePagedKvFp8(void* base, int32_t block_size, int32_t num_kv_heads,
                           int32_t head_dim);
// Bytes of one block in that layout.
int64_t Fp8BlockBytes(int32_t block_size, int32_t num_kv_heads, int32_t head_dim);

// OK, or kInvalidArgument naming the field: a non-null base, positive
// num_kv_heads, block_size and head_dim multiples of 16, 16-byte aligned
// offsets and stride, and K, V and the scales overlapping neither each other
// nor the next block.
absl::Status ValidatePagedKvFp8(const PagedKvFp8& kv);

// As cpu::AppendKv: token i's K row (num_kv_heads * head_dim floats) at
// k + i * k_stride and V row at v + i * v_stride go to slot slots[i]; a
// negative slot is skipped. Each (token, head) row of K and of V gets its
// scale numeric::Fp8E4M3Scale(row) and elements FloatToFp8E4M3(x / scale).
// REQUIRES: ValidatePagedKvFp8(kv).ok(); slots distinct and inside the cache.
void AppendKvFp8(const PagedKvFp8& kv, const float* k, int64_t k_stride, const float* v,
                 int64_t v_stride, const int64_t* slots, int64_t num_tokens);

// The stored (dequantized: e4m3 value times scale) K and V of kv head `head`
// at slot `slot` of block `block`, head_dim floats each.
void ReadKvFp8(const PagedKvFp8& kv, int64_t block, int32_t slot, int32_t head, float* k,
               float* v);

}  // namespace trident::kernels::cpu

#endif  // TRIDENT_KERNELS_CPU_PAGED_KV_FP8_PAGED_KV_FP8_H_
