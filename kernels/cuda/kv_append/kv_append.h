#ifndef TRIDENT_KERNELS_CUDA_KV_APPEND_KV_APPEND_H_
#define TRIDENT_KERNELS_CUDA_KV_APPEND_KV_APPEND_H_

// Stores a step's keys and values into the paged bf16 KV cache on the GPU,
// with the semantics and cache layout of kernels/cpu/paged_attention AppendKv
// (the reference). For one layer, block b starts at
//   base + b * block_stride_elems
// and holds K then, value_offset_elems further on, V, each
// [num_kv_heads][block_size][head_dim]; element (kv head h, slot offset t,
// dim d) of K sits at base + b * block_stride_elems + (h * block_size + t) *
// head_dim + d. Token i goes to slot slots[i]: block slots[i] / block_size,
// offset slots[i] % block_size.
//
// A negative slot (padding) is skipped, as on the CPU. Slots live on the
// device, so the host cannot check them: a slot >= num_blocks * block_size is
// also skipped (nothing is written outside the cache) and is a caller bug the
// scheduler must prevent. The copy is exact (bf16 in, bf16 out). The kernel
// takes raw device pointers and a stream, never allocates and never
// synchronizes.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/kv_append/kv_slot.h"

namespace trident::kernels::cuda {

// One layer's view of a bf16 paged KV cache (cpu::PagedKv with dtype kBF16,
// plus the block count that bounds the writes). Offsets count bf16 elements.
struct PagedKvBf16 {
  void* base = nullptr;  // Device pointer.
  int64_t num_blocks = 0;
  int32_t block_size = 16;  // Tokens per block.
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t block_stride_elems = 0;  // From block b to block b + 1.
  int64_t value_offset_elems = 0;  // From a block's K to its V.
};

// OK, or kInvalidArgument naming the field: a non-null base, positive
// num_blocks, block_size, num_kv_heads and head_dim, and strides under which
// one block's K and V ([num_kv_heads * block_size * head_dim] each) overlap
// neither each other nor the next block (as cpu::ValidatePagedKv).
absl::Status ValidatePagedKvBf16(const PagedKvBf16& kv);

// For a kernel that stores each token's k and v in `kv` itself, at
// slots[token] (device), as LaunchKvAppend would (RoPE, Hopper's q/k/v
// GEMV): OK, or kInvalidArgument where ValidatePagedKvBf16 refuses kv, its
// heads or head_dim are not the step's, or slots is null.
absl::Status ValidateKvStore(const PagedKvBf16& kv, const int64_t* slots, int32_t num_kv_heads,
                             int32_t head_dim);

// `kv` and `slots` as such a kernel takes them.
inline KvSlotTarget SlotTargetOf(const PagedKvBf16& kv, const int64_t* slots) {
  return {kv.base,
          kv.num_blocks * kv.block_size,
          kv.block_size,
          kv.block_stride_elems,
          kv.value_offset_elems,
          slots};
}

struct KvAppendArgs {
  PagedKvBf16 kv;
  // Device pointers: token i's K row (all kv heads, num_kv_heads * head_dim
  // bf16 values) at k + i * k_stride, its V row at v + i * v_stride (elements;
  // e.g. the k and v sections of the fused qkv buffer, strides = its width).
  const void* k = nullptr;
  int64_t k_stride = 0;
  const void* v = nullptr;
  int64_t v_stride = 0;
  // Device pointer to num_tokens slots; distinct where non-negative.
  const int64_t* slots = nullptr;
  int64_t num_tokens = 0;
  // Launch with programmatic dependent launch (kernels/cuda/pdl): scheduled
  // before the kernel ahead of it ends, waiting for it before any load.
  bool pdl = false;
};

// Enqueues the copy on `stream`. kInvalidArgument for an invalid kv (see
// ValidatePagedKvBf16), negative num_tokens, strides smaller than a row, or
// null pointers with tokens to store; kInternal if the launch fails. Zero
// tokens is a no-op. Moves 16 bytes at a time when head_dim, strides and
// cache offsets are multiples of 8 and the pointers 16-byte aligned, 2 bytes
// otherwise.
absl::Status LaunchKvAppend(const KvAppendArgs& args, cudaStream_t stream);

// One layer's view of an FP8 E4M3 paged KV cache, in the layout of
// kernels/cpu/paged_kv_fp8 (the reference): per block, K
// [num_kv_heads][block_size][head_dim], V value_offset_bytes further on,
// transposed in groups of 16 tokens ([num_kv_heads][block_size / 16]
// [head_dim][16]), each 16-element group in MMA fragment order, and f32
// scales [2][num_kv_heads][block_size] (K's, then V's) scale_offset_bytes
// from the block's start.
struct PagedKvFp8Gpu {
  void* base = nullptr;  // Device pointer, 16-byte aligned.
  int64_t num_blocks = 0;
  int32_t block_size = 16;  // A multiple of 16.
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;  // A multiple of 16, at most 256.
  int64_t block_stride_bytes = 0;
  int64_t value_offset_bytes = 0;
  int64_t scale_offset_bytes = 0;
};

// OK, or kInvalidArgument naming the field: positive num_blocks, head_dim
// <= 256, and cpu::ValidatePagedKvFp8 (which it calls) for the rest.
absl::Status ValidatePagedKvFp8Gpu(const PagedKvFp8Gpu& kv);

struct KvAppendFp8Args {
  PagedKvFp8Gpu kv;
  // As KvAppendArgs: bf16 K and V rows of num_kv_heads * head_dim elements.
  const void* k = nullptr;
  int64_t k_stride = 0;
  const void* v = nullptr;
  int64_t v_stride = 0;
  const int64_t* slots = nullptr;
  int64_t num_tokens = 0;
  // Launch with programmatic dependent launch (kernels/cuda/pdl): scheduled
  // before the kernel ahead of it ends, waiting for it before any load.
  bool pdl = false;
};

// Quantizes and stores a step's K and V, byte for byte as cpu::AppendKvFp8:
// each (token, kv head) row of K and of V gets the scale amax / 448 (1 for
// an all-zero row) and elements rounded to nearest even, saturating.
// Padding and out-of-range slots are skipped as in LaunchKvAppend. Errors as
// LaunchKvAppend's.
absl::Status LaunchKvAppendFp8(const KvAppendFp8Args& args, cudaStream_t stream);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_KV_APPEND_KV_APPEND_H_
