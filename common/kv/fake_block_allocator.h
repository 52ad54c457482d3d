#ifndef TRIDENT_COMMON_KV_FAKE_BLOCK_ALLOCATOR_H_
#define TRIDENT_COMMON_KV_FAKE_BLOCK_ALLOCATOR_H_

// A BlockAllocator for tests of code that uses one (the scheduler).

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/kv/block_allocator.h"

namespace trident::kv {

// A working allocator with the BlockAllocator contract whose choices are
// easy to predict: Allocate always hands out the lowest free ids, in
// ascending order. `FailNextAllocate` makes the next Allocate call return a
// given error (e.g. to simulate a full cache without filling it).
//
// Thread-compatible.
class FakeBlockAllocator final : public BlockAllocator {
 public:
  explicit FakeBlockAllocator(int32_t num_blocks) : num_total_(num_blocks) {
    for (int32_t b = 0; b < num_blocks; ++b) free_.insert(b);
  }

  absl::StatusOr<std::vector<int32_t>> Allocate(int32_t num_blocks) override {
    ++num_allocate_calls_;
    if (!next_allocate_error_.ok()) return std::exchange(next_allocate_error_, absl::OkStatus());
    if (num_blocks < 0) return absl::InvalidArgumentError("negative block count");
    if (num_blocks > num_free()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("fake KV cache full: ", num_blocks, " requested, ", num_free(), " free"));
    }
    std::vector<int32_t> blocks;
    for (int32_t i = 0; i < num_blocks; ++i)
      blocks.push_back(*free_.begin()), free_.erase(free_.begin());
    return blocks;
  }

  absl::Status Free(absl::Span<const int32_t> blocks) override {
    std::set<int32_t> seen;
    for (const int32_t b : blocks) {
      if (b < 0 || b >= num_total_ || free_.count(b) > 0 || !seen.insert(b).second) {
        return absl::FailedPreconditionError(absl::StrCat("bad free of block ", b));
      }
    }
    free_.insert(blocks.begin(), blocks.end());
    return absl::OkStatus();
  }

  int32_t num_free() const override { return static_cast<int32_t>(free_.size()); }
  int32_t num_used() const override { return num_total_ - num_free(); }
  int32_t num_total() const override { return num_total_; }

  // The next Allocate returns `error` and reserves nothing.
  void FailNextAllocate(absl::Status error) { next_allocate_error_ = std::move(error); }
  int num_allocate_calls() const { return num_allocate_calls_; }

 private:
  const int32_t num_total_;
  std::set<int32_t> free_;
  absl::Status next_allocate_error_;
  int num_allocate_calls_ = 0;
};

}  // namespace trident::kv

#endif  // TRIDENT_COMMON_KV_FAKE_BLOCK_ALLOCATOR_H_
