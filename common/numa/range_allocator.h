#ifndef TRIDENT_COMMON_NUMA_RANGE_ALLOCATOR_H_
#define TRIDENT_COMMON_NUMA_RANGE_ALLOCATOR_H_

// Hands out contiguous byte ranges of a fixed span [0, capacity_bytes), such
// as the KV memory of a NumaArena. It only does the bookkeeping: it never
// touches memory.
//
// Policy: best fit over a free list kept both by offset and by length. A
// request takes the smallest free range that holds it (the lowest offset among
// equals) and splits off the rest; a freed range merges with free neighbours
// at once, so freeing everything always leaves exactly one free range. Both
// operations are O(log n) in the number of free ranges.
//
// Lengths are rounded up to the alignment, and every offset is a multiple of
// it:
//
//   offset 0          a          2a         3a         4a         5a
//          | used: x (2a)        | free (1a) | used: y (2a)         |
//
// Thread-safe: every method takes one internal mutex.

#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace trident::numa {

// A range of bytes of an arena, relative to its base.
struct ByteRange {
  int64_t offset = 0;
  int64_t length = 0;

  friend bool operator==(const ByteRange&, const ByteRange&) = default;
};

class RangeAllocator {
 public:
  // Manages [0, capacity_bytes) in units of `alignment_bytes`.
  // REQUIRES: `alignment_bytes` is a power of two; `capacity_bytes` is a
  // positive multiple of it (NumaArena::Create checks both for its callers).
  RangeAllocator(int64_t capacity_bytes, int64_t alignment_bytes);

  RangeAllocator(const RangeAllocator&) = delete;
  RangeAllocator& operator=(const RangeAllocator&) = delete;

  // Reserves `bytes` rounded up to the alignment. The returned range has that
  // rounded length. kInvalidArgument if `bytes` <= 0; kResourceExhausted if
  // no free range is long enough, with the requested, free and largest free
  // byte counts in the message (nothing is reserved then).
  absl::StatusOr<ByteRange> Allocate(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  // Returns `range`, exactly as Allocate returned it, to the free list.
  // kInvalidArgument (and nothing changes) if it is not a range currently
  // allocated: a double free, or a range Allocate did not return.
  absl::Status Free(ByteRange range) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t capacity_bytes() const { return capacity_bytes_; }
  int64_t alignment_bytes() const { return alignment_bytes_; }
  // Bytes in allocated ranges (after rounding).
  int64_t used_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // capacity_bytes() - used_bytes().
  int64_t free_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // The length of the longest free range: the largest Allocate that succeeds
  // now. 0 when full.
  int64_t largest_free_range() const ABSL_LOCKS_EXCLUDED(mu_);
  // The number of free ranges (1 when empty, 0 when full): a fragmentation
  // measure.
  int64_t num_free_ranges() const ABSL_LOCKS_EXCLUDED(mu_);
  // The number of ranges allocated now.
  int64_t num_allocated_ranges() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void InsertFreeLocked(int64_t offset, int64_t length) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseFreeLocked(std::map<int64_t, int64_t>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t capacity_bytes_;
  const int64_t alignment_bytes_;

  mutable absl::Mutex mu_;
  std::map<int64_t, int64_t> free_by_offset_ ABSL_GUARDED_BY(mu_);             // offset -> length
  std::set<std::pair<int64_t, int64_t>> free_by_length_ ABSL_GUARDED_BY(mu_);  // (length, offset)
  std::map<int64_t, int64_t> allocated_ ABSL_GUARDED_BY(mu_);                  // offset -> length
  int64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trident::numa

#endif  // TRIDENT_COMMON_NUMA_RANGE_ALLOCATOR_H_
