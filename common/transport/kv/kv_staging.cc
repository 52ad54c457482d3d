#include "common/transport/kv/kv_staging.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

namespace trident::transport {

namespace v1 = ::trident::v1;

absl::StatusOr<std::shared_ptr<StagingSlots>> StagingSlots::Create(backend::KvCopier& copier,
                                                                   uint64_t staging_bytes,
                                                                   uint64_t slot_bytes,
                                                                   uint64_t message_bytes) {
  if (slot_bytes < message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("staging_slot_bytes is ", slot_bytes,
                                                   "; a KV message takes ", message_bytes,
                                                   " bytes (max_message_bytes rounded to whole "
                                                   "blocks)"));
  }
  const uint64_t num_slots = staging_bytes / slot_bytes;
  if (num_slots < 1 || num_slots > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("staging_bytes is ", staging_bytes,
                                                   "; must hold 1 to 2^20 slots of ", slot_bytes,
                                                   " bytes"));
  }
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<backend::HostBuffer> memory,
                           copier.AllocateHost(num_slots * slot_bytes));
  return std::make_shared<StagingSlots>(std::move(memory), slot_bytes, static_cast<int>(num_slots));
}

StagingSlots::StagingSlots(std::unique_ptr<backend::HostBuffer> memory, uint64_t slot_bytes,
                           int num_slots)
    : memory_(std::move(memory)), slot_bytes_(slot_bytes) {
  for (int i = num_slots - 1; i >= 0; --i) free_.push_back(i);
}

int StagingSlots::Acquire() {
  absl::MutexLock lock(&mu_, absl::Condition(this, &StagingSlots::HasFree));
  const int slot = free_.back();
  free_.pop_back();
  return slot;
}

void StagingSlots::Release(int slot) {
  absl::MutexLock lock(&mu_);
  free_.push_back(slot);
}

// One layer's outstanding sends, plus one count for the posting itself; the
// last to finish reports the layer.
struct StagedKvTransfer::Layer {
  absl::Mutex mu;
  int remaining ABSL_GUARDED_BY(mu) = 1;
  absl::Status status ABSL_GUARDED_BY(mu);
  int64_t bytes ABSL_GUARDED_BY(mu) = 0;
  std::function<void(absl::Status)> done;
  std::shared_ptr<Stats> stats;

  void Complete(absl::Status s) {
    absl::Status result;
    int64_t layer_bytes = 0;
    {
      absl::MutexLock lock(&mu);
      if (!s.ok() && status.ok()) status = std::move(s);
      if (--remaining > 0) return;
      result = status;
      layer_bytes = bytes;
    }
    if (result.ok()) stats->bytes_completed += layer_bytes;
    std::function<void(absl::Status)> callback = std::move(done);
    callback(std::move(result));
  }
};

// The sends from one staging slot; the last frees it.
struct StagedKvTransfer::Slot {
  std::shared_ptr<StagingSlots> slots;
  int slot = 0;
  std::atomic<int> remaining{0};
};

StagedKvTransfer::StagedKvTransfer(const kv::KvCacheSpec& spec, backend::KvCopier* copier,
                                   std::shared_ptr<StagingSlots> slots,
                                   std::vector<std::shared_ptr<Endpoint>> endpoints,
                                   v1::KvDestination destination, uint64_t message_bytes)
    : spec_(spec),
      copier_(copier),
      slots_(std::move(slots)),
      endpoints_(std::move(endpoints)),
      destination_(std::move(destination)),
      message_bytes_(message_bytes),
      rendezvous_(RendezvousForLane(endpoints_.front()->lane())) {}

void StagedKvTransfer::SendLayer(int32_t layer, absl::Span<const int32_t> local_blocks,
                                 std::function<void(absl::Status)> done) {
  if (absl::Status invalid = CheckLayerBlocks(spec_, destination_, layer, local_blocks);
      !invalid.ok()) {
    done(std::move(invalid));
    return;
  }
  const std::vector<KvPut> messages =
      SplitKvPuts(PlanLayerPuts(spec_, destination_, layer, local_blocks), message_bytes_);
  auto state = std::make_shared<Layer>();
  state->done = std::move(done);
  state->stats = stats_;
  absl::Status posting;
  for (size_t i = 0; i < messages.size() && posting.ok();) {
    // Messages [i, j) fill one slot (each fits: StagingSlots::Create checked).
    size_t j = i;
    uint64_t slot_bytes = 0;
    while (j < messages.size() && slot_bytes + messages[j].length_bytes <= slots_->slot_bytes()) {
      slot_bytes += messages[j].length_bytes;
      ++j;
    }
    posting = SendFromOneSlot(messages, i, j, state);
    i = j;
  }
  state->Complete(std::move(posting));
}

absl::Status StagedKvTransfer::SendFromOneSlot(const std::vector<KvPut>& messages, size_t first,
                                               size_t last, const std::shared_ptr<Layer>& layer) {
  std::vector<backend::KvRange> ranges;
  uint64_t slot_bytes = 0;
  for (size_t k = first; k < last; ++k) {
    ranges.push_back(
        {.offset_bytes = messages[k].local_offset_bytes, .length_bytes = messages[k].length_bytes});
    slot_bytes += messages[k].length_bytes;
  }
  auto slot = std::make_shared<Slot>();
  slot->slots = slots_;
  slot->slot = slots_->Acquire();
  char* const staged = slots_->data(slot->slot);
  if (absl::Status copied = copier_->CopyToHost(ranges, staged); !copied.ok()) {
    slots_->Release(slot->slot);
    return copied;
  }
  const int count = static_cast<int>(last - first);
  slot->remaining = count;
  {
    absl::MutexLock lock(&layer->mu);
    layer->remaining += count;
    layer->bytes += static_cast<int64_t>(slot_bytes);
  }
  stats_->messages += count;
  stats_->bytes_posted += static_cast<int64_t>(slot_bytes);
  uint64_t at = 0;
  for (size_t k = first; k < last; ++k) {
    const KvMessageHeader header{.reservation_id = destination_.reservation_id(),
                                 .remote_address = messages[k].remote_address};
    endpoints_[next_lane_++ % endpoints_.size()]->Send(
        kKvMessageId, header.Encode(), staged + at, messages[k].length_bytes,
        [slot, layer](absl::Status s) {
          if (--slot->remaining == 0) slot->slots->Release(slot->slot);
          layer->Complete(std::move(s));
        },
        rendezvous_);
    at += messages[k].length_bytes;
  }
  return absl::OkStatus();
}

}  // namespace trident::transport
