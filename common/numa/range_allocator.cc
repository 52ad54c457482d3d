#include "common/numa/range_allocator.h"

#include <cstdint>
#include <iterator>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/logging/log.h"

namespace trident::numa {

RangeAllocator::RangeAllocator(int64_t capacity_bytes, int64_t alignment_bytes)
    : capacity_bytes_(capacity_bytes), alignment_bytes_(alignment_bytes) {
  TRIDENT_CHECK(alignment_bytes > 0 && (alignment_bytes & (alignment_bytes - 1)) == 0)
      << "alignment " << alignment_bytes << " is not a power of two";
  TRIDENT_CHECK(capacity_bytes > 0 && capacity_bytes % alignment_bytes == 0)
      << "capacity " << capacity_bytes << " is not a positive multiple of " << alignment_bytes;
  absl::MutexLock lock(&mu_);
  InsertFreeLocked(0, capacity_bytes);
}

void RangeAllocator::InsertFreeLocked(int64_t offset, int64_t length) {
  free_by_offset_.emplace(offset, length);
  free_by_length_.emplace(length, offset);
}

void RangeAllocator::EraseFreeLocked(std::map<int64_t, int64_t>::iterator it) {
  free_by_length_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

absl::StatusOr<ByteRange> RangeAllocator::Allocate(int64_t bytes) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("Allocate: ", bytes, " bytes; want > 0"));
  }
  absl::MutexLock lock(&mu_);
  // Checked before rounding, which could overflow for absurd requests.
  const int64_t length = bytes > capacity_bytes_
                             ? capacity_bytes_ + 1
                             : (bytes + alignment_bytes_ - 1) & ~(alignment_bytes_ - 1);
  // The shortest free range that fits; among equals the lowest offset.
  auto best = free_by_length_.lower_bound({length, 0});
  if (best == free_by_length_.end()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", bytes, " bytes in a ", capacity_bytes_,
        "-byte arena: ", capacity_bytes_ - used_bytes_, " bytes free, largest free range ",
        free_by_length_.empty() ? 0 : free_by_length_.rbegin()->first, " bytes (",
        free_by_offset_.size(), " free ranges)"));
  }
  const int64_t offset = best->second;
  const int64_t free_length = best->first;
  EraseFreeLocked(free_by_offset_.find(offset));
  if (free_length > length) InsertFreeLocked(offset + length, free_length - length);
  allocated_.emplace(offset, length);
  used_bytes_ += length;
  return ByteRange{offset, length};
}

absl::Status RangeAllocator::Free(ByteRange range) {
  absl::MutexLock lock(&mu_);
  auto allocated = allocated_.find(range.offset);
  if (allocated == allocated_.end() || allocated->second != range.length) {
    return absl::InvalidArgumentError(
        absl::StrCat("Free: [", range.offset, ", +", range.length, ") is not an allocated range"));
  }
  allocated_.erase(allocated);
  used_bytes_ -= range.length;
  int64_t offset = range.offset;
  int64_t length = range.length;
  // Merge with the free range that ends where this one starts, and with the
  // one that starts where it ends: the free list never holds neighbours.
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == offset) {
      offset = previous->first;
      length += previous->second;
      EraseFreeLocked(previous);
    }
  }
  if (next != free_by_offset_.end() && next->first == offset + length) {
    length += next->second;
    EraseFreeLocked(next);
  }
  InsertFreeLocked(offset, length);
  return absl::OkStatus();
}

int64_t RangeAllocator::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_bytes_;
}

int64_t RangeAllocator::free_bytes() const {
  absl::MutexLock lock(&mu_);
  return capacity_bytes_ - used_bytes_;
}

int64_t RangeAllocator::largest_free_range() const {
  absl::MutexLock lock(&mu_);
  return free_by_length_.empty() ? 0 : free_by_length_.rbegin()->first;
}

int64_t RangeAllocator::num_free_ranges() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_by_offset_.size());
}

int64_t RangeAllocator::num_allocated_ranges() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(allocated_.size());
}

}  // namespace trident::numa
