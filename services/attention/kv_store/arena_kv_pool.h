// A KvPool over one NUMA-bound arena (common/numa/numa_arena.h): every range
// lies in the arena's single mapping, on its node, so the service registers
// the arena with UCX once and every sequence's KV is reachable with its rkey.

#ifndef TRIDENT_SERVICES_ATTENTION_KV_STORE_ARENA_KV_POOL_H_
#define TRIDENT_SERVICES_ATTENTION_KV_STORE_ARENA_KV_POOL_H_

#include <memory>

#include "common/numa/numa_arena.h"
#include "services/attention/kv_store/kv_pool.h"

namespace trident::attention {

// Thread-safe.
class ArenaKvPool final : public KvPool {
 public:
  explicit ArenaKvPool(std::unique_ptr<numa::NumaArena> arena) : arena_(std::move(arena)) {}

  absl::StatusOr<KvSpan> Allocate(size_t bytes) override;
  void Free(KvSpan span) override;
  size_t capacity_bytes() const override { return static_cast<size_t>(arena_->capacity_bytes()); }
  size_t used_bytes() const override { return static_cast<size_t>(arena_->used_bytes()); }

  const numa::NumaArena& arena() const { return *arena_; }

 private:
  const std::unique_ptr<numa::NumaArena> arena_;
};

}  // namespace trident::attention

#endif  // TRIDENT_SERVICES_ATTENTION_KV_STORE_ARENA_KV_POOL_H_
