// A BlockAllocator that many threads may call: it serializes another
// allocator's calls with a mutex. A disaggregated decode worker reserves
// blocks for incoming KV from RPC threads while the engine's loop thread
// allocates for running sequences, through one of these.

#ifndef TRIDENT_COMMON_KV_LOCKED_BLOCK_ALLOCATOR_H_
#define TRIDENT_COMMON_KV_LOCKED_BLOCK_ALLOCATOR_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/kv/block_allocator.h"

namespace trident::kv {

// Thread-safe.
class LockedBlockAllocator final : public BlockAllocator {
 public:
  explicit LockedBlockAllocator(std::unique_ptr<BlockAllocator> inner) : inner_(std::move(inner)) {}

  absl::StatusOr<std::vector<int32_t>> Allocate(int32_t num_blocks) override {
    absl::MutexLock lock(&mu_);
    return inner_->Allocate(num_blocks);
  }
  absl::Status Free(absl::Span<const int32_t> blocks) override {
    absl::MutexLock lock(&mu_);
    return inner_->Free(blocks);
  }
  int32_t num_free() const override {
    absl::MutexLock lock(&mu_);
    return inner_->num_free();
  }
  int32_t num_used() const override {
    absl::MutexLock lock(&mu_);
    return inner_->num_used();
  }
  int32_t num_total() const override {
    absl::MutexLock lock(&mu_);
    return inner_->num_total();
  }
  std::vector<int32_t> AcquireCached(absl::Span<const BlockKey> keys) override {
    absl::MutexLock lock(&mu_);
    return inner_->AcquireCached(keys);
  }
  bool Publish(int32_t block, const BlockKey& key) override {
    absl::MutexLock lock(&mu_);
    return inner_->Publish(block, key);
  }
  int32_t num_cached() const override {
    absl::MutexLock lock(&mu_);
    return inner_->num_cached();
  }
  absl::Status CheckInvariants() const override {
    absl::MutexLock lock(&mu_);
    return inner_->CheckInvariants();
  }

 private:
  mutable absl::Mutex mu_;
  std::unique_ptr<BlockAllocator> inner_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::kv

#endif  // TRIDENT_COMMON_KV_LOCKED_BLOCK_ALLOCATOR_H_
