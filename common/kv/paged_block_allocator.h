#ifndef TRIDENT_COMMON_KV_PAGED_BLOCK_ALLOCATOR_H_
#define TRIDENT_COMMON_KV_PAGED_BLOCK_ALLOCATOR_H_

// The engine's BlockAllocator: a fixed pool of block ids, handed out as
// contiguous, ascending runs wherever the pool allows.
//
// Why runs: a KV transfer moves a run of consecutive ids in one message (up
// to the message size) and a block out of order in a message of its own
// (one block of one layer: 64 KiB for Llama-3-8B), so a prompt's
// reservation that is scattered over the pool costs hundreds of messages
// where a run costs a few. Decode sequences grow one block at a time,
// interleaved with each other, so a free list handing back freed blocks in
// their order still scatters: every sequence that decoded in a batch frees
// ids that alternate with its neighbours'.
//
// Policy:
//   * Allocate(n) takes the first run of n free ids (lowest first);
//   * if no free run is that long, the lowest free ids, ascending (a reserved
//     prompt's blocks then form as few runs as the holes allow).
// Single blocks (decode growth) thus fill the lowest holes, and the long
// free stretches above stay whole for the next prompts. A fresh allocator
// hands out 0, 1, 2, ... in order.
//
// Cost: a bitmap of free ids, scanned a 64-bit word at a time; Allocate is
// O(num_blocks / 64) words at worst plus O(n), Free O(n).
//
// Thread-compatible (not thread-safe): the engine's scheduler thread owns it.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/kv/block_allocator.h"

namespace trident::kv {

class PagedBlockAllocator final : public BlockAllocator {
 public:
  // REQUIRES: num_blocks >= 0 (a KvCacheSpec that passed Validate).
  explicit PagedBlockAllocator(int32_t num_blocks);

  PagedBlockAllocator(const PagedBlockAllocator&) = delete;
  PagedBlockAllocator& operator=(const PagedBlockAllocator&) = delete;

  absl::StatusOr<std::vector<int32_t>> Allocate(int32_t num_blocks) override;
  absl::Status Free(absl::Span<const int32_t> blocks) override;

  int32_t num_free() const override { return num_free_; }
  int32_t num_used() const override { return num_total_ - num_free_; }
  int32_t num_total() const override { return num_total_; }

  // Whether `block` is currently allocated. False for out-of-range ids.
  bool IsAllocated(int32_t block) const;

 private:
  bool IsFree(int32_t block) const { return (free_[block >> 6] >> (block & 63)) & 1; }
  void SetFree(int32_t block, bool free);
  // The first id of the lowest run of `n` free ids, or -1.
  int32_t FirstRun(int32_t n) const;
  // The lowest free id at or above `from`, or num_total_.
  int32_t NextFree(int32_t from) const;

  const int32_t num_total_;
  int32_t num_free_;
  // Bit b of free_[w] is set while block 64 * w + b is free.
  std::vector<uint64_t> free_;
};

}  // namespace trident::kv

#endif  // TRIDENT_COMMON_KV_PAGED_BLOCK_ALLOCATOR_H_
