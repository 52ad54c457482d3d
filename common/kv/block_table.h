#ifndef TRIDENT_COMMON_KV_BLOCK_TABLE_H_
#define TRIDENT_COMMON_KV_BLOCK_TABLE_H_

// The KV blocks of one sequence and how many of their token slots are used.
//
//   blocks():  [ 7 ][ 2 ][ 9 ]          block_size = 4, num_tokens = 10
//   positions:  0-3  4-7  8-9 (10, 11 free)
//   SlotOf(9) = 9 * 4 + 9 % 4 = 37      (block 9, slot 1 within it)
//
// A slot is a token's index in the flat [num_blocks * block_size] token space
// of one layer, as paged-attention kernels take it (vLLM's slot_mapping).

#include <cstdint>
#include <vector>

#include "absl/base/macros.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/kv/block_allocator.h"

namespace trident::kv {

// Thread-compatible; owned by the sequence, touched by the scheduler thread.
class BlockTable {
 public:
  // REQUIRES: block_size > 0.
  explicit BlockTable(int32_t block_size);

  BlockTable(BlockTable&&) = default;
  BlockTable& operator=(BlockTable&&) = default;

  int32_t block_size() const { return block_size_; }
  // Tokens whose KV the blocks hold (or will hold once the current step runs).
  int32_t num_tokens() const { return num_tokens_; }
  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  // Tokens the current blocks can hold: num_blocks() * block_size().
  int64_t capacity_tokens() const { return int64_t{num_blocks()} * block_size_; }
  // Block ids in position order. Valid until the next Append or ReleaseAll.
  absl::Span<const int32_t> blocks() const { return blocks_; }

  // Blocks to Append before the sequence can hold `new_num_tokens` tokens in
  // total: ceil(new_num_tokens / block_size) - num_blocks(), or 0 if it
  // already can.
  int32_t BlocksNeededFor(int32_t new_num_tokens) const;

  // Adds `blocks` (freshly allocated, owned from now on by this table) after
  // the current ones.
  void Append(absl::Span<const int32_t> blocks);

  // Records that the sequence now has `num_tokens` tokens.
  // REQUIRES: 0 <= num_tokens <= capacity_tokens().
  void SetNumTokens(int32_t num_tokens);

  // The slot of token `position`:
  // blocks()[position / block_size] * block_size + position % block_size.
  // REQUIRES: 0 <= position < capacity_tokens().
  int64_t SlotOf(int32_t position) const {
    ABSL_ASSERT(position >= 0 && position < capacity_tokens());
    return int64_t{blocks_[position / block_size_]} * block_size_ + position % block_size_;
  }

  // Frees every block to `allocator` and empties the table (num_tokens 0).
  // Returns the allocator's error (a bug: the table held a block the
  // allocator did not hand out) and leaves the table unchanged in that case.
  absl::Status ReleaseAll(BlockAllocator& allocator);

 private:
  int32_t block_size_;
  int32_t num_tokens_ = 0;
  std::vector<int32_t> blocks_;
};

}  // namespace trident::kv

#endif  // TRIDENT_COMMON_KV_BLOCK_TABLE_H_
