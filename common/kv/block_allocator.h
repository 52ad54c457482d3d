#ifndef TRIDENT_COMMON_KV_BLOCK_ALLOCATOR_H_
#define TRIDENT_COMMON_KV_BLOCK_ALLOCATOR_H_

// The interface through which the engine obtains KV-cache blocks. A block id
// names one block of every layer (see kv_layout.h): block b of the cache
// holds the K and V entries of `block_size` consecutive tokens of one
// sequence, in every layer.
//
// Blocks are reference-counted: Allocate hands out blocks with one
// reference, Free drops one. An allocator with prefix caching
// (PrefixCachingBlockAllocator) also names blocks by the key of the KV they
// hold (Publish) and hands a named block to several holders
// (AcquireCached); a named block whose last reference goes stays cached,
// evictable, until Allocate needs it. Allocators without caching (the
// defaults below) never name a block, so every block has one holder.
//
//   free ──Allocate──▶ held (refs >= 1) ──Free (last ref)──▶ free
//                        │ Publish(key)                      ▲ evicted by
//                        ▼                                   │ Allocate
//                      held + named ──Free (last ref)──▶ cached ──AcquireCached──▶ held + named

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/kv/block_key.h"

namespace trident::kv {

// Hands out block ids in [0, num_total()).
//
// Thread-compatible: callers serialize access. In the engine only the
// scheduler thread, which owns the allocator, calls it.
class BlockAllocator {
 public:
  virtual ~BlockAllocator() = default;

  // Reserves `num_blocks` blocks, all or nothing, and returns their ids
  // (distinct; in no particular order). `num_blocks == 0` returns an empty
  // vector. RESOURCE_EXHAUSTED if fewer than `num_blocks` blocks are free,
  // INVALID_ARGUMENT if `num_blocks` is negative; nothing is reserved then.
  virtual absl::StatusOr<std::vector<int32_t>> Allocate(int32_t num_blocks) = 0;

  // Drops one reference on each of `blocks`; a block whose last reference
  // goes returns to the pool (cached, if it is named). FAILED_PRECONDITION
  // if any id is out of range, not currently held, or repeated in `blocks`;
  // in that case nothing changes (all or nothing, like Allocate). A caller
  // freeing a sequence's blocks passes them in token order: the tail is
  // evicted first.
  virtual absl::Status Free(absl::Span<const int32_t> blocks) = 0;

  // Blocks available to Allocate (cached blocks nobody holds included).
  virtual int32_t num_free() const = 0;
  // Blocks held: num_total() - num_free().
  virtual int32_t num_used() const = 0;
  // Size of the pool.
  virtual int32_t num_total() const = 0;

  // Prefix caching. Takes one reference on each block of the longest chain
  // of named blocks matching `keys` from the first (it stops at the first
  // key no block holds) and returns their ids, in key order. Empty without
  // caching.
  virtual std::vector<int32_t> AcquireCached(absl::Span<const BlockKey> keys) {
    (void)keys;
    return {};
  }
  // Names `block`, whose KV is complete, by `key`, so that AcquireCached
  // finds it. Returns false and leaves the block unnamed when another block
  // already holds `key` (a duplicate: it stays its holder's alone), when
  // `block` is named already, or without caching. REQUIRES: `block` is held.
  virtual bool Publish(int32_t block, const BlockKey& key) {
    (void)block;
    (void)key;
    return false;
  }
  // Named blocks nobody holds (counted in num_free()).
  virtual int32_t num_cached() const { return 0; }
  // The pool's invariants (every block free, cached or held exactly once;
  // reference counts and the key index consistent); INTERNAL naming the
  // first broken one.
  virtual absl::Status CheckInvariants() const { return absl::OkStatus(); }
};

}  // namespace trident::kv

#endif  // TRIDENT_COMMON_KV_BLOCK_ALLOCATOR_H_
