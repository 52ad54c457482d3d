#include "common/kv/block_table.h"

#include <cstdint>

#include "common/logging/log.h"

namespace trident::kv {

BlockTable::BlockTable(int32_t block_size) : block_size_(block_size) {
  TRIDENT_CHECK(block_size > 0) << "block_size " << block_size;
}

int32_t BlockTable::BlocksNeededFor(int32_t new_num_tokens) const {
  const int64_t needed = (int64_t{new_num_tokens} + block_size_ - 1) / block_size_;
  return needed > num_blocks() ? static_cast<int32_t>(needed - num_blocks()) : 0;
}

void BlockTable::Append(absl::Span<const int32_t> blocks) {
  blocks_.insert(blocks_.end(), blocks.begin(), blocks.end());
}

void BlockTable::SetNumTokens(int32_t num_tokens) {
  TRIDENT_CHECK(num_tokens >= 0 && num_tokens <= capacity_tokens())
      << "num_tokens " << num_tokens << " with capacity " << capacity_tokens();
  num_tokens_ = num_tokens;
}

absl::Status BlockTable::ReleaseAll(BlockAllocator& allocator) {
  const absl::Status status = allocator.Free(blocks_);
  if (!status.ok()) return status;
  blocks_.clear();
  num_tokens_ = 0;
  return absl::OkStatus();
}

}  // namespace trident::kv
