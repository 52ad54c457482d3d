#ifndef TRIDENT_COMMON_KV_PAGED_BLOCK_ALLOCATOR_H_
#define TRIDENT_COMMON_KV_PAGED_BLOCK_ALLOCATOR_H_

// The engine's BlockAllocator: a fixed pool of block ids managed with a free
// list.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/kv/block_allocator.h"

namespace trident::kv {

// A LIFO free list over block ids [0, num_blocks): the most recently freed
// blocks are handed out first, so that their cache lines and TLB entries are
// still warm, and in the order they were given to Free, so that the
// ascending runs of a finished sequence come back as ascending runs (KV
// transfers move a run in one message). A fresh allocator hands out 0, 1,
// 2, ... in order. Allocate and Free cost O(1) per block; a bitmap of
// allocated ids catches double frees.
//
// Thread-compatible (not thread-safe): the engine's scheduler thread owns it.
class PagedBlockAllocator final : public BlockAllocator {
 public:
  // REQUIRES: num_blocks >= 0 (a KvCacheSpec that passed Validate).
  explicit PagedBlockAllocator(int32_t num_blocks);

  PagedBlockAllocator(const PagedBlockAllocator&) = delete;
  PagedBlockAllocator& operator=(const PagedBlockAllocator&) = delete;

  absl::StatusOr<std::vector<int32_t>> Allocate(int32_t num_blocks) override;
  absl::Status Free(absl::Span<const int32_t> blocks) override;

  int32_t num_free() const override { return static_cast<int32_t>(free_list_.size()); }
  int32_t num_used() const override { return num_total_ - num_free(); }
  int32_t num_total() const override { return num_total_; }

  // Whether `block` is currently allocated. False for out-of-range ids.
  bool IsAllocated(int32_t block) const;

 private:
  const int32_t num_total_;
  // Free ids; the back is handed out next.
  std::vector<int32_t> free_list_;
  // allocated_[b] is true while block b is allocated.
  std::vector<bool> allocated_;
};

}  // namespace trident::kv

#endif  // TRIDENT_COMMON_KV_PAGED_BLOCK_ALLOCATOR_H_
