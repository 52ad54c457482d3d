#ifndef TRIDENT_COMMON_KV_PREFIX_CACHING_BLOCK_ALLOCATOR_H_
#define TRIDENT_COMMON_KV_PREFIX_CACHING_BLOCK_ALLOCATOR_H_

// The engine's BlockAllocator with automatic prefix caching (vLLM's block
// pool, with SGLang's pool invariant): blocks are reference-counted, a block
// whose KV is complete can be named by its BlockKey (Publish), and a named
// block outlives its holders as a cached block until the pool needs it.
//
//   every block is exactly one of:
//     free     in the PagedBlockAllocator below, unnamed, no holder
//     held     refs >= 1, named or not
//     cached   refs == 0, named, on the LRU list (evictable)
//
//   LRU list:  head ─▶ [evicted first] ◀─▶ ... ◀─▶ [most recently freed] ◀─ tail
//
// Free appends cached blocks at the tail in reverse token order, so a
// sequence's last block is evicted before its first (a prefix outlives its
// continuations). Allocate takes truly free blocks first (contiguous runs,
// as PagedBlockAllocator hands out) and evicts from the LRU head only for
// what is missing; an evicted block loses its name. AcquireCached revives a
// cached block (off the list, refs 1) or adds a holder to a held one.
//
// Costs: AcquireCached and Publish O(1) per block (a hash map), Free O(n),
// Allocate PagedBlockAllocator's plus O(1) per eviction.
//
// Thread-compatible; the engine wraps it in a LockedBlockAllocator.

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/kv/block_allocator.h"
#include "common/kv/block_key.h"
#include "common/kv/paged_block_allocator.h"

namespace trident::kv {

class PrefixCachingBlockAllocator final : public BlockAllocator {
 public:
  // REQUIRES: num_blocks >= 0.
  explicit PrefixCachingBlockAllocator(int32_t num_blocks);

  PrefixCachingBlockAllocator(const PrefixCachingBlockAllocator&) = delete;
  PrefixCachingBlockAllocator& operator=(const PrefixCachingBlockAllocator&) = delete;

  absl::StatusOr<std::vector<int32_t>> Allocate(int32_t num_blocks) override;
  absl::Status Free(absl::Span<const int32_t> blocks) override;
  int32_t num_free() const override { return pool_.num_free() + num_cached_; }
  int32_t num_used() const override { return num_total() - num_free(); }
  int32_t num_total() const override { return pool_.num_total(); }

  std::vector<int32_t> AcquireCached(absl::Span<const BlockKey> keys) override;
  bool Publish(int32_t block, const BlockKey& key) override;
  int32_t num_cached() const override { return num_cached_; }
  absl::Status CheckInvariants() const override;

  // Called with each key that leaves the cache (its block evicted), and
  // with each key a Publish names, for KV events; under the caller's
  // serialization (the LockedBlockAllocator's lock): they must be quick and
  // must not call back. Null: nobody listens.
  void set_eviction_listener(std::function<void(const BlockKey&)> listener) {
    on_evict_ = std::move(listener);
  }
  void set_publish_listener(std::function<void(const BlockKey&)> listener) {
    on_publish_ = std::move(listener);
  }

  // Holders of `block` (0 for a free or cached one); -1 out of range.
  int32_t RefCountForTesting(int32_t block) const;
  // Cached blocks evicted since construction.
  int64_t num_evicted() const { return num_evicted_; }

 private:
  struct Entry {
    int32_t refs = 0;
    // The key of the KV it holds once published; empty while unnamed.
    BlockKey key;
    // LRU links while cached; -1 at the ends.
    int32_t prev = -1;
    int32_t next = -1;
    bool named() const { return !key.empty(); }
  };
  void LinkTail(int32_t block);
  void Unlink(int32_t block);
  // Evicts the LRU head: unnamed and back in pool_.
  void EvictOne();

  PagedBlockAllocator pool_;
  std::vector<Entry> entries_;
  absl::flat_hash_map<BlockKey, int32_t> index_;
  int32_t lru_head_ = -1;
  int32_t lru_tail_ = -1;
  int32_t num_cached_ = 0;
  int64_t num_evicted_ = 0;
  std::function<void(const BlockKey&)> on_evict_;
  std::function<void(const BlockKey&)> on_publish_;
};

}  // namespace trident::kv

#endif  // TRIDENT_COMMON_KV_PREFIX_CACHING_BLOCK_ALLOCATOR_H_
