#ifndef TRIDENT_COMMON_TRANSPORT_KV_KV_STAGING_H_
#define TRIDENT_COMMON_TRANSPORT_KV_KV_STAGING_H_

// Staged sending (UcxKv's path for a KV pool in CUDA device memory that UCX
// cannot register, UCX being built without CUDA support): each layer's
// blocks are copied out (backend::KvCopier::CopyToHost) into pinned host
// staging slots and sent from there as KV messages, the same messages
// KvWriter's kMessage mode sends:
//
//   SendLayer(l):  for each slot's worth of the layer's messages:
//                    wait for a free slot (back-pressure)
//                    CopyToHost(the messages' runs) -> slot
//                    Send(each message) -- the slot is free again once
//                                          every message in it was sent
//
// SendLayer returns once the layer is copied out and its messages posted, so
// the caller's next SendLayer copies layer l + 1 while UCX sends layer l.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/backend/kv_copier.h"
#include "common/kv/kv_layout.h"
#include "common/transport/kv/kv_sender.h"
#include "common/transport/kv/kv_writer.h"
#include "common/transport/ucx_worker.h"
#include "trident/v1/worker.pb.h"

namespace trident::transport {

// The staging memory of a staged sender, in slots of equal size.
// Thread-safe.
class StagingSlots {
 public:
  // `staging_bytes` of host memory from `copier` (KvCopier::AllocateHost) in
  // slots of `slot_bytes`, each holding at least one message of
  // `message_bytes`. INVALID_ARGUMENT naming the option (staging_slot_bytes,
  // staging_bytes) for slots smaller than a message or fewer than 1 (or more
  // than 2^20) slots; the copier's errors for the memory.
  static absl::StatusOr<std::shared_ptr<StagingSlots>> Create(backend::KvCopier& copier,
                                                              uint64_t staging_bytes,
                                                              uint64_t slot_bytes,
                                                              uint64_t message_bytes);

  StagingSlots(std::unique_ptr<backend::HostBuffer> memory, uint64_t slot_bytes, int num_slots);

  // Waits for a free slot and takes it.
  int Acquire() ABSL_LOCKS_EXCLUDED(mu_);
  // Gives back a slot Acquire returned.
  void Release(int slot) ABSL_LOCKS_EXCLUDED(mu_);
  char* data(int slot) const { return memory_->data() + static_cast<uint64_t>(slot) * slot_bytes_; }
  uint64_t slot_bytes() const { return slot_bytes_; }

 private:
  bool HasFree() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !free_.empty(); }

  const std::unique_ptr<backend::HostBuffer> memory_;
  const uint64_t slot_bytes_;
  absl::Mutex mu_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
};

// A transfer from a staged pool (see the file comment). Thread-compatible,
// as KvTransfer is; the sends' callbacks may outlive it. SendLayer waits
// while every staging slot is in flight, so it must not run on a UCX
// progress thread.
class StagedKvTransfer final : public KvTransfer {
 public:
  // `copier` (not owned) must outlive the transfer; `endpoints` (one per
  // lane, from UcxLanes::EndpointsTo) take the messages in turn.
  // REQUIRES: ValidateKvDestination(spec, destination).ok(); every message
  // of `message_bytes` fits a slot.
  StagedKvTransfer(const kv::KvCacheSpec& spec, backend::KvCopier* copier,
                   std::shared_ptr<StagingSlots> slots,
                   std::vector<std::shared_ptr<Endpoint>> endpoints,
                   trident::v1::KvDestination destination, uint64_t message_bytes);

  // INVALID_ARGUMENT (CheckLayerBlocks) with nothing sent for bad arguments;
  // the copier's error for a failed copy-out (messages already posted still
  // complete); else the first send error.
  void SendLayer(int32_t layer, absl::Span<const int32_t> local_blocks,
                 std::function<void(absl::Status)> done) override;
  int64_t bytes_sent() const override { return stats_->bytes_completed.load(); }
  int64_t message_bytes() const override { return stats_->bytes_posted.load(); }
  int32_t messages() const override { return static_cast<int32_t>(stats_->messages.load()); }
  std::string lane() const override { return endpoints_.front()->lane(); }

 private:
  // Shared with in-flight callbacks, which may outlive the transfer.
  struct Stats {
    std::atomic<int64_t> messages{0};
    std::atomic<int64_t> bytes_posted{0};
    std::atomic<int64_t> bytes_completed{0};
  };
  struct Layer;
  struct Slot;

  // Copies messages [first, last) of a layer into one slot and sends them;
  // the copier's error (and the slot given back) if the copy fails.
  absl::Status SendFromOneSlot(const std::vector<KvPut>& messages, size_t first, size_t last,
                               const std::shared_ptr<Layer>& layer);

  const kv::KvCacheSpec spec_;
  backend::KvCopier* const copier_;
  const std::shared_ptr<StagingSlots> slots_;
  const std::vector<std::shared_ptr<Endpoint>> endpoints_;
  size_t next_lane_ = 0;
  const trident::v1::KvDestination destination_;
  const uint64_t message_bytes_;
  const bool rendezvous_;
  const std::shared_ptr<Stats> stats_ = std::make_shared<Stats>();
};

}  // namespace trident::transport

#endif  // TRIDENT_COMMON_TRANSPORT_KV_KV_STAGING_H_
