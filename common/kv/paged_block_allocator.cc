#include "common/kv/paged_block_allocator.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"

namespace trident::kv {

PagedBlockAllocator::PagedBlockAllocator(int32_t num_blocks)
    : num_total_(num_blocks), allocated_(num_blocks < 0 ? 0 : num_blocks, false) {
  TRIDENT_CHECK(num_blocks >= 0) << "negative block count " << num_blocks;
  free_list_.reserve(num_blocks);
  // Pushed in reverse so that the first allocations return 0, 1, 2, ...
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
}

absl::StatusOr<std::vector<int32_t>> PagedBlockAllocator::Allocate(int32_t num_blocks) {
  if (num_blocks < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot allocate ", num_blocks, " blocks"));
  }
  if (num_blocks > num_free()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: ", num_blocks,
                                                     " blocks requested, ", num_free(), " of ",
                                                     num_total_, " free"));
  }
  std::vector<int32_t> blocks(free_list_.end() - num_blocks, free_list_.end());
  // The back of the free list is the most recently freed block; hand it out first.
  std::reverse(blocks.begin(), blocks.end());
  free_list_.resize(free_list_.size() - num_blocks);
  for (const int32_t b : blocks) allocated_[b] = true;
  return blocks;
}

absl::Status PagedBlockAllocator::Free(absl::Span<const int32_t> blocks) {
  // Clears the bits as it validates, so that an id repeated within `blocks`
  // is seen as a double free; on error the bits cleared so far are restored.
  for (size_t i = 0; i < blocks.size(); ++i) {
    const int32_t b = blocks[i];
    if (!IsAllocated(b)) {
      for (size_t j = 0; j < i; ++j) allocated_[blocks[j]] = true;
      return absl::FailedPreconditionError(
          b < 0 || b >= num_total_
              ? absl::StrCat("freeing block ", b, ", outside [0, ", num_total_, ")")
              : absl::StrCat("freeing block ", b, ", which is not allocated (double free)"));
    }
    allocated_[b] = false;
  }
  // Reversed, so that Allocate (which takes the back in reverse) hands these
  // out again in the order given: a sequence's ascending ids come back
  // ascending, as contiguous runs a KV transfer moves in few large messages
  // (pushed as given, every other reuse came back descending, one message
  // per block).
  free_list_.insert(free_list_.end(), blocks.rbegin(), blocks.rend());
  return absl::OkStatus();
}

bool PagedBlockAllocator::IsAllocated(int32_t block) const {
  return block >= 0 && block < num_total_ && allocated_[block];
}

}  // namespace trident::kv
