// A KvPool on the process heap: each range is its own aligned allocation,
// and the budget is only counted. For tests, and where memory need not be
// NUMA-bound.

#ifndef TRIDENT_SERVICES_ATTENTION_KV_STORE_HEAP_KV_POOL_H_
#define TRIDENT_SERVICES_ATTENTION_KV_STORE_HEAP_KV_POOL_H_

#include <atomic>
#include <cstddef>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "services/attention/kv_store/kv_pool.h"

namespace trident::attention {

// Thread-safe.
class HeapKvPool final : public KvPool {
 public:
  explicit HeapKvPool(size_t capacity_bytes) : capacity_(capacity_bytes) {}

  absl::StatusOr<KvSpan> Allocate(size_t bytes) override ABSL_LOCKS_EXCLUDED(mu_);
  void Free(KvSpan span) override ABSL_LOCKS_EXCLUDED(mu_);
  size_t capacity_bytes() const override { return capacity_; }
  size_t used_bytes() const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  size_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trident::attention

#endif  // TRIDENT_SERVICES_ATTENTION_KV_STORE_HEAP_KV_POOL_H_
