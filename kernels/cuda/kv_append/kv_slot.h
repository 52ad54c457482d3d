#ifndef TRIDENT_KERNELS_CUDA_KV_APPEND_KV_SLOT_H_
#define TRIDENT_KERNELS_CUDA_KV_APPEND_KV_SLOT_H_

// Where one token's k and v elements go in a paged KV cache addressed in
// elements (the bf16 layout of kv_append.h's PagedKvBf16): per block, K
// [num_kv_heads][block_size][head_dim], V value_offset elements further on.
// Shared by the kernels that store a token's k and v as they compute them
// (RoPE, Hopper's q/k/v GEMV) so that they store where LaunchKvAppend does;
// host and device alike, so the arithmetic has a CPU test.

#include <cstdint>

#ifdef __CUDACC__
#define TRIDENT_KV_SLOT_HOST_DEVICE __host__ __device__
#else
#define TRIDENT_KV_SLOT_HOST_DEVICE
#endif

namespace trident::kernels::cuda {

struct KvSlot {
  int64_t base = -1;  // element 0 of kv head 0 of the slot in K; -1: store nothing
  int64_t value_offset = 0;
  int64_t head_stride = 0;  // block_size * head_dim

  TRIDENT_KV_SLOT_HOST_DEVICE bool stored() const { return base >= 0; }

  // Element d of kv head `head` of the token's K (or, is_v, V).
  TRIDENT_KV_SLOT_HOST_DEVICE int64_t At(bool is_v, int64_t head, int64_t d) const {
    return base + (is_v ? value_offset : 0) + head * head_stride + d;
  }
};

// The slot's place in a cache of capacity_slots (blocks x block_size)
// slots; a slot outside [0, capacity_slots) (padding) stores nothing.
TRIDENT_KV_SLOT_HOST_DEVICE inline KvSlot KvSlotOf(int64_t slot, int64_t capacity_slots,
                                                   int32_t block_size, int64_t block_stride,
                                                   int64_t value_offset, int32_t head_dim) {
  KvSlot place;
  if (slot < 0 || slot >= capacity_slots) return place;
  const int64_t block = slot / block_size;
  place.base = block * block_stride + (slot - block * block_size) * head_dim;
  place.value_offset = value_offset;
  place.head_stride = int64_t{block_size} * head_dim;
  return place;
}

// A bf16 cache in elements and the step's slots (device): what a kernel
// that stores k and v as it computes them is handed (base null: none).
struct KvSlotTarget {
  void* base = nullptr;
  int64_t capacity_slots = 0;  // blocks x block_size
  int32_t block_size = 0;
  int64_t block_stride = 0;
  int64_t value_offset = 0;
  const int64_t* slots = nullptr;

  // Token `token`'s place (none without a cache).
  TRIDENT_KV_SLOT_HOST_DEVICE KvSlot Of(int64_t token, int32_t head_dim) const {
    if (base == nullptr) return KvSlot{};
    return KvSlotOf(slots[token], capacity_slots, block_size, block_stride, value_offset, head_dim);
  }
};

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_KV_APPEND_KV_SLOT_H_
