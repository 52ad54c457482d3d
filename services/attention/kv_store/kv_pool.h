// Where an attention service keeps its sequences' KV: a pool of host memory
// with a byte budget, handing out contiguous ranges. The service's pool is a
// NUMA-bound arena (common/numa); HeapKvPool (below) is a plain one for
// tests and for machines without NUMA.

#ifndef TRIDENT_SERVICES_ATTENTION_KV_STORE_KV_POOL_H_
#define TRIDENT_SERVICES_ATTENTION_KV_STORE_KV_POOL_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace trident::attention {

// A contiguous range of a pool.
struct KvSpan {
  char* data = nullptr;
  size_t bytes = 0;
};

// Thread-safe.
class KvPool {
 public:
  virtual ~KvPool() = default;

  // A range of at least `bytes` bytes (the length granted is in `bytes` of
  // the result), aligned to 64 bytes or more. RESOURCE_EXHAUSTED, with the
  // bytes asked and free, when the budget cannot hold it.
  virtual absl::StatusOr<KvSpan> Allocate(size_t bytes) = 0;

  // Returns a range Allocate gave.
  virtual void Free(KvSpan span) = 0;

  // The budget, and what ranges currently hold.
  virtual size_t capacity_bytes() const = 0;
  virtual size_t used_bytes() const = 0;
};

}  // namespace trident::attention

#endif  // TRIDENT_SERVICES_ATTENTION_KV_STORE_KV_POOL_H_
