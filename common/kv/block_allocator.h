#ifndef TRIDENT_COMMON_KV_BLOCK_ALLOCATOR_H_
#define TRIDENT_COMMON_KV_BLOCK_ALLOCATOR_H_

// The interface through which the engine obtains KV-cache blocks. A block id
// names one block of every layer (see kv_layout.h): block b of the cache
// holds the K and V entries of `block_size` consecutive tokens of one
// sequence, in every layer.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

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

  // Returns `blocks` to the pool. FAILED_PRECONDITION if any id is out of
  // range, not currently allocated, or repeated in `blocks`; in that case no
  // block is freed (all or nothing, like Allocate).
  virtual absl::Status Free(absl::Span<const int32_t> blocks) = 0;

  // Blocks available to Allocate.
  virtual int32_t num_free() const = 0;
  // Blocks allocated and not yet freed: num_total() - num_free().
  virtual int32_t num_used() const = 0;
  // Size of the pool.
  virtual int32_t num_total() const = 0;
};

}  // namespace trident::kv

#endif  // TRIDENT_COMMON_KV_BLOCK_ALLOCATOR_H_
