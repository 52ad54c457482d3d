#include "common/kv/prefix_caching_block_allocator.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/logging/log.h"

namespace trident::kv {

PrefixCachingBlockAllocator::PrefixCachingBlockAllocator(int32_t num_blocks)
    : pool_(num_blocks), entries_(static_cast<size_t>(num_blocks < 0 ? 0 : num_blocks)) {}

void PrefixCachingBlockAllocator::LinkTail(int32_t block) {
  Entry& e = entries_[block];
  e.prev = lru_tail_;
  e.next = -1;
  if (lru_tail_ >= 0) {
    entries_[lru_tail_].next = block;
  } else {
    lru_head_ = block;
  }
  lru_tail_ = block;
  ++num_cached_;
}

void PrefixCachingBlockAllocator::Unlink(int32_t block) {
  Entry& e = entries_[block];
  if (e.prev >= 0) {
    entries_[e.prev].next = e.next;
  } else {
    lru_head_ = e.next;
  }
  if (e.next >= 0) {
    entries_[e.next].prev = e.prev;
  } else {
    lru_tail_ = e.prev;
  }
  e.prev = e.next = -1;
  --num_cached_;
}

void PrefixCachingBlockAllocator::EvictOne() {
  const int32_t block = lru_head_;
  TRIDENT_CHECK(block >= 0);
  Unlink(block);
  Entry& e = entries_[block];
  index_.erase(e.key);
  const BlockKey key = e.key;
  e.key = BlockKey{};
  ++num_evicted_;
  // Cached blocks count as allocated in pool_; this one is free there now.
  TRIDENT_CHECK_OK(pool_.Free({block}));
  if (on_evict_) on_evict_(key);
}

absl::StatusOr<std::vector<int32_t>> PrefixCachingBlockAllocator::Allocate(int32_t num_blocks) {
  if (num_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", num_blocks, " blocks"));
  }
  if (num_blocks > num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: ", num_blocks,
                                                     " blocks requested, ", num_free(), " of ",
                                                     num_total(), " free (", num_cached_,
                                                     " of them cached)"));
  }
  while (pool_.num_free() < num_blocks) EvictOne();
  absl::StatusOr<std::vector<int32_t>> blocks = pool_.Allocate(num_blocks);
  if (!blocks.ok()) return blocks.status();
  for (const int32_t b : *blocks) entries_[b].refs = 1;
  return blocks;
}

absl::Status PrefixCachingBlockAllocator::Free(absl::Span<const int32_t> blocks) {
  // A repeated id is a double free even for a block with several holders
  // (no holder holds a block twice).
  absl::flat_hash_set<int32_t> seen;
  for (const int32_t b : blocks) {
    if (b < 0 || b >= num_total()) {
      return absl::FailedPreconditionError(
          absl::StrCat("freeing block ", b, ", outside [0, ", num_total(), ")"));
    }
    if (entries_[b].refs < 1 || !seen.insert(b).second) {
      return absl::FailedPreconditionError(
          absl::StrCat("freeing block ", b, ", which is not held (double free)"));
    }
  }
  std::vector<int32_t> unnamed;
  // Reverse token order: the tail reaches the LRU list first, so it is
  // evicted first.
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    Entry& e = entries_[*it];
    if (--e.refs > 0) continue;
    if (e.named()) {
      LinkTail(*it);
    } else {
      unnamed.push_back(*it);
    }
  }
  TRIDENT_CHECK_OK(pool_.Free(unnamed));
  return absl::OkStatus();
}

std::vector<int32_t> PrefixCachingBlockAllocator::AcquireCached(absl::Span<const BlockKey> keys) {
  std::vector<int32_t> blocks;
  for (const BlockKey& key : keys) {
    auto it = index_.find(key);
    if (it == index_.end()) break;
    const int32_t b = it->second;
    Entry& e = entries_[b];
    if (e.refs == 0) Unlink(b);
    ++e.refs;
    blocks.push_back(b);
  }
  return blocks;
}

bool PrefixCachingBlockAllocator::Publish(int32_t block, const BlockKey& key) {
  TRIDENT_CHECK(block >= 0 && block < num_total() && entries_[block].refs > 0)
      << "publishing block " << block << ", which is not held";
  Entry& e = entries_[block];
  if (e.named() || key.empty()) return false;
  if (!index_.emplace(key, block).second) return false;
  e.key = key;
  if (on_publish_) on_publish_(key);
  return true;
}

int32_t PrefixCachingBlockAllocator::RefCountForTesting(int32_t block) const {
  if (block < 0 || block >= num_total()) return -1;
  return entries_[block].refs;
}

absl::Status PrefixCachingBlockAllocator::CheckInvariants() const {
  int32_t held = 0, cached = 0, free = 0, named = 0;
  for (int32_t b = 0; b < num_total(); ++b) {
    const Entry& e = entries_[b];
    if (e.refs < 0) return absl::InternalError(absl::StrCat("block ", b, " has refs ", e.refs));
    const bool in_pool = !pool_.IsAllocated(b);
    if (in_pool) {
      if (e.refs != 0 || e.named()) {
        return absl::InternalError(absl::StrCat("free block ", b, " is held or named"));
      }
      ++free;
    } else if (e.refs > 0) {
      ++held;
    } else {
      if (!e.named()) return absl::InternalError(absl::StrCat("block ", b, " is lost"));
      ++cached;
    }
    if (e.named()) {
      ++named;
      auto it = index_.find(e.key);
      if (it == index_.end() || it->second != b) {
        return absl::InternalError(absl::StrCat("named block ", b, " is not indexed"));
      }
    }
  }
  if (named != static_cast<int32_t>(index_.size())) {
    return absl::InternalError(absl::StrCat(index_.size(), " keys index ", named, " named blocks"));
  }
  int32_t listed = 0;
  for (int32_t b = lru_head_, prev = -1; b >= 0; prev = b, b = entries_[b].next) {
    if (entries_[b].prev != prev || entries_[b].refs != 0 || !entries_[b].named()) {
      return absl::InternalError(absl::StrCat("LRU list broken at block ", b));
    }
    if (++listed > num_total()) return absl::InternalError("LRU list has a cycle");
  }
  if (listed != cached || cached != num_cached_ || free != pool_.num_free() ||
      free + held + cached != num_total()) {
    return absl::InternalError(absl::StrCat("pool of ", num_total(), ": ", free, " free + ", held,
                                            " held + ", cached, " cached (", listed,
                                            " listed, counted ", num_cached_, ")"));
  }
  return absl::OkStatus();
}

}  // namespace trident::kv
