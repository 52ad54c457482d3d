#include "common/kv/paged_block_allocator.h"

#include <cstdint>
#include <vector>

#include "absl/numeric/bits.h"
#include "absl/strings/str_cat.h"
#include "common/logging/log.h"

namespace trident::kv {

PagedBlockAllocator::PagedBlockAllocator(int32_t num_blocks)
    : num_total_(num_blocks),
      num_free_(num_blocks < 0 ? 0 : num_blocks),
      free_((num_free_ + 63) / 64, ~uint64_t{0}) {
  TRIDENT_CHECK(num_blocks >= 0) << "negative block count " << num_blocks;
  // Ids past the pool's end are never free.
  if (num_total_ % 64 != 0) free_.back() = (uint64_t{1} << (num_total_ % 64)) - 1;
}

void PagedBlockAllocator::SetFree(int32_t block, bool free) {
  const uint64_t bit = uint64_t{1} << (block & 63);
  if (free) {
    free_[block >> 6] |= bit;
  } else {
    free_[block >> 6] &= ~bit;
  }
}

int32_t PagedBlockAllocator::NextFree(int32_t from) const {
  if (from >= num_total_) return num_total_;
  size_t w = static_cast<size_t>(from) >> 6;
  uint64_t word = free_[w] & (~uint64_t{0} << (from & 63));
  while (word == 0) {
    if (++w == free_.size()) return num_total_;
    word = free_[w];
  }
  return static_cast<int32_t>(w * 64 + absl::countr_zero(word));
}

int32_t PagedBlockAllocator::FirstRun(int32_t n) const {
  int32_t start = NextFree(0);
  while (start + n <= num_total_) {
    // The run from `start`: whole free words at a time, then bit by bit.
    int32_t end = start;
    while (end < num_total_ && end - start < n) {
      if ((end & 63) == 0 && free_[end >> 6] == ~uint64_t{0} && end + 64 <= num_total_) {
        end += 64;
      } else if (IsFree(end)) {
        ++end;
      } else {
        break;
      }
    }
    if (end - start >= n) return start;
    start = NextFree(end);
  }
  return -1;
}

absl::StatusOr<std::vector<int32_t>> PagedBlockAllocator::Allocate(int32_t num_blocks) {
  if (num_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", num_blocks, " blocks"));
  }
  if (num_blocks > num_free_) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: ", num_blocks,
                                                     " blocks requested, ", num_free_, " of ",
                                                     num_total_, " free"));
  }
  std::vector<int32_t> blocks;
  blocks.reserve(num_blocks);
  if (num_blocks == 0) return blocks;
  const int32_t run = FirstRun(num_blocks);
  if (run >= 0) {
    for (int32_t b = run; b < run + num_blocks; ++b) blocks.push_back(b);
  } else {
    for (int32_t b = NextFree(0); static_cast<int32_t>(blocks.size()) < num_blocks;
         b = NextFree(b + 1)) {
      blocks.push_back(b);
    }
  }
  for (const int32_t b : blocks) SetFree(b, false);
  num_free_ -= num_blocks;
  return blocks;
}

absl::Status PagedBlockAllocator::Free(absl::Span<const int32_t> blocks) {
  // Marks the ids free as it validates, so that an id repeated within
  // `blocks` is seen as a double free; on error the ids marked so far are
  // allocated again.
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int32_t b = blocks[i];
    if (!IsAllocated(b)) {
      for (size_t j = 0; j < i; ++j) SetFree(blocks[j], false);
      return absl::FailedPreconditionError(
          b < 0 || b >= num_total_
              ? absl::StrCat("freeing block ", b, ", outside [0, ", num_total_, ")")
              : absl::StrCat("freeing block ", b, ", which is not allocated (double free)"));
    }
    SetFree(b, true);
  }
  num_free_ += static_cast<int32_t>(blocks.size());
  return absl::OkStatus();
}

bool PagedBlockAllocator::IsAllocated(int32_t block) const {
  return block >= 0 && block < num_total_ && !IsFree(block);
}

}  // namespace trident::kv
