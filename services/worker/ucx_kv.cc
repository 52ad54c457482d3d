#include "services/worker/ucx_kv.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/kv/kv_layout.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"
#include "common/transport/kv_writer.h"

namespace trident::worker {

// The staging memory of a staged sender, in slots. Thread-safe.
class UcxKv::StagingSlots {
 public:
  StagingSlots(std::unique_ptr<backend::HostBuffer> memory, uint64_t slot_bytes, int num_slots)
      : memory_(std::move(memory)), slot_bytes_(slot_bytes) {
    for (int i = num_slots - 1; i >= 0; --i) free_.push_back(i);
  }

  // Waits for a free slot and takes it.
  int Acquire() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_, absl::Condition(this, &StagingSlots::HasFree));
    const int slot = free_.back();
    free_.pop_back();
    return slot;
  }
  void Release(int slot) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    free_.push_back(slot);
  }
  char* data(int slot) const { return memory_->data() + static_cast<uint64_t>(slot) * slot_bytes_; }
  uint64_t slot_bytes() const { return slot_bytes_; }

 private:
  bool HasFree() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !free_.empty(); }

  const std::unique_ptr<backend::HostBuffer> memory_;
  const uint64_t slot_bytes_;
  absl::Mutex mu_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
};

// KV messages sent by rendezvous into a pool that copies them in (a GPU or staged pool): each is
// fetched into one of a few receive buffers from the copier (reused, so page-faulted once; pinned
// for a GPU), then copied into the pool by the receive threads while UCX fetches the next. At most
// `max_fetches` are fetched at once (UCX interleaves the fragments of concurrent fetches, so more
// would finish together in bursts instead of one after another, starving the copy stage); the
// rest wait, announced but not fetched, as they do while every buffer is busy. Thread-safe.
class UcxKv::Receiver {
 public:
  // `allocate` makes a buffer of `buffer_bytes`, on first use.
  Receiver(UcxKv* kv, int num_buffers, uint64_t buffer_bytes,
           std::function<absl::StatusOr<std::unique_ptr<backend::HostBuffer>>()> allocate,
           int num_threads, int max_fetches)
      : kv_(kv),
        buffer_bytes_(buffer_bytes),
        allocate_(std::move(allocate)),
        max_fetches_(max_fetches) {
    buffers_.resize(num_buffers);
    for (int i = 0; i < num_buffers; ++i) free_.push_back(i);
    for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this] { Run(); });
  }

  // Waits for fetches in flight (their buffers must outlive them), then
  // stops the threads; messages still waiting are dropped.
  ~Receiver() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      waiting_.clear();
      auto no_fetch = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return fetching_ == 0; };
      mu_.Await(absl::Condition(&no_fetch));
    }
    // They copy in what is ready, then return.
    for (std::thread& thread : threads_) thread.join();
  }

  // The rendezvous handler (progress thread).
  void OnMessage(absl::string_view header, std::unique_ptr<transport::IncomingMessage> message) {
    if (message->length() > buffer_bytes_) {
      kv_->Dropped(absl::InvalidArgumentError(absl::StrCat("a KV message of ", message->length(),
                                                           " bytes exceeds the receive buffers' ",
                                                           buffer_bytes_, " bytes")));
      return;  // Dropping it releases the sender.
    }
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    waiting_.push_back({std::string(header), std::move(message)});
    Pump();
  }

 private:
  struct Waiting {
    std::string header;
    std::unique_ptr<transport::IncomingMessage> message;
  };
  struct Ready {
    int buffer;
    std::string header;
    size_t length;
  };

  // Starts fetching `message` into `buffer`.
  void Fetch(int buffer, std::string header, std::unique_ptr<transport::IncomingMessage> message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (buffers_[buffer] == nullptr) {
      absl::StatusOr<std::unique_ptr<backend::HostBuffer>> allocated = allocate_();
      if (!allocated.ok()) {
        kv_->Dropped(allocated.status());
        free_.push_back(buffer);
        return;  // Dropping `message` releases its sender.
      }
      buffers_[buffer] = *std::move(allocated);
    }
    ++fetching_;
    const size_t length = message->length();
    transport::IncomingMessage* raw = message.release();
    // `raw` lives until the fetch completes (its callback deletes it).
    raw->Receive(buffers_[buffer]->data(),
                 [this, raw, buffer, header = std::move(header), length](absl::Status status) {
                   delete raw;
                   Fetched(buffer, header, length, std::move(status));
                 });
  }

  // A fetch completed (progress thread).
  void Fetched(int buffer, const std::string& header, size_t length, absl::Status status) {
    if (!status.ok()) kv_->Dropped(status);
    if (status.ok() && threads_.empty()) {
      kv_->CopyIn(header, absl::string_view(buffers_[buffer]->data(), length));
    }
    absl::MutexLock lock(&mu_);
    --fetching_;
    if (status.ok() && !threads_.empty()) {
      ready_.push_back({buffer, header, length});
    } else {
      free_.push_back(buffer);
    }
    Pump();
  }

  // Starts fetches while messages wait, buffers are free and fewer than
  // max_fetches_ run.
  void Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!stopping_ && !waiting_.empty() && !free_.empty() && fetching_ < max_fetches_) {
      Waiting next = std::move(waiting_.front());
      waiting_.pop_front();
      const int buffer = free_.back();
      free_.pop_back();
      Fetch(buffer, std::move(next.header), std::move(next.message));
    }
  }

  void Run() {
    while (true) {
      Ready item;
      {
        auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !ready_.empty();
        };
        absl::MutexLock lock(&mu_, absl::Condition(&has_work));
        if (ready_.empty()) return;  // Stopping.
        item = std::move(ready_.front());
        ready_.pop_front();
      }
      kv_->CopyIn(item.header, absl::string_view(buffers_[item.buffer]->data(), item.length));
      absl::MutexLock lock(&mu_);
      free_.push_back(item.buffer);
      Pump();
    }
  }

  UcxKv* const kv_;
  const uint64_t buffer_bytes_;
  const std::function<absl::StatusOr<std::unique_ptr<backend::HostBuffer>>()> allocate_;
  const int max_fetches_;
  absl::Mutex mu_;
  // Allocated on first use, under mu_; read by whoever holds the buffer.
  std::vector<std::unique_ptr<backend::HostBuffer>> buffers_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
  std::deque<Waiting> waiting_ ABSL_GUARDED_BY(mu_);
  std::deque<Ready> ready_ ABSL_GUARDED_BY(mu_);
  int fetching_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

namespace {

namespace v1 = ::trident::v1;

// Longest wait for a decode worker's UCX handshake answer.
constexpr absl::Duration kHandshakeTimeout = absl::Seconds(10);

class UcxTransfer final : public KvTransfer {
 public:
  explicit UcxTransfer(std::unique_ptr<transport::KvWriter> writer) : writer_(std::move(writer)) {}
  void SendLayer(int32_t layer, absl::Span<const int32_t> local_blocks,
                 std::function<void(absl::Status)> done) override {
    writer_->WriteLayer(layer, local_blocks, std::move(done));
  }
  int64_t bytes_sent() const override { return writer_->bytes_completed(); }
  int64_t message_bytes() const override {
    return writer_->mode() == transport::KvWriteMode::kMessage ? writer_->bytes_posted() : 0;
  }
  int32_t messages() const override { return static_cast<int32_t>(writer_->messages_posted()); }
  std::string lane() const override { return writer_->lane(); }

 private:
  std::unique_ptr<transport::KvWriter> writer_;
};

// A transfer from a staged pool: see ucx_kv.h's file comment.
class StagedTransfer final : public KvTransfer {
 public:
  StagedTransfer(const kv::KvCacheSpec& spec, backend::KvCopier* copier,
                 std::shared_ptr<UcxKv::StagingSlots> slots,
                 std::vector<std::shared_ptr<transport::Endpoint>> endpoints,
                 v1::KvDestination destination, uint64_t message_bytes)
      : spec_(spec),
        copier_(copier),
        slots_(std::move(slots)),
        endpoints_(std::move(endpoints)),
        destination_(std::move(destination)),
        message_bytes_(message_bytes),
        rendezvous_(transport::RendezvousForLane(endpoints_.front()->lane())) {}

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
  // One layer's outstanding sends, plus one count for the posting itself;
  // the last to finish reports the layer.
  struct Layer {
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
  struct Slot {
    std::shared_ptr<UcxKv::StagingSlots> slots;
    int slot = 0;
    std::atomic<int> remaining{0};
  };

  const kv::KvCacheSpec spec_;
  backend::KvCopier* const copier_;
  const std::shared_ptr<UcxKv::StagingSlots> slots_;
  // The main endpoint and the lanes' (EndpointsFor); messages take them in
  // turn from next_lane_.
  const std::vector<std::shared_ptr<transport::Endpoint>> endpoints_;
  size_t next_lane_ = 0;
  const v1::KvDestination destination_;
  const uint64_t message_bytes_;
  const bool rendezvous_;
  const std::shared_ptr<Stats> stats_ = std::make_shared<Stats>();
};

void StagedTransfer::SendLayer(int32_t layer, absl::Span<const int32_t> local_blocks,
                               std::function<void(absl::Status)> done) {
  if (absl::Status invalid = transport::CheckLayerBlocks(spec_, destination_, layer, local_blocks);
      !invalid.ok()) {
    done(std::move(invalid));
    return;
  }
  const std::vector<transport::KvPut> messages = transport::SplitKvPuts(
      transport::PlanLayerPuts(spec_, destination_, layer, local_blocks), message_bytes_);
  auto state = std::make_shared<Layer>();
  state->done = std::move(done);
  state->stats = stats_;
  absl::Status posting;
  const size_t n = messages.size();
  for (size_t i = 0; i < n;) {
    // Messages [i, j) fill one slot (each fits: Create checked).
    size_t j = i;
    uint64_t slot_bytes = 0;
    std::vector<backend::KvRange> ranges;
    while (j < n && slot_bytes + messages[j].length_bytes <= slots_->slot_bytes()) {
      ranges.push_back({.offset_bytes = messages[j].local_offset_bytes,
                        .length_bytes = messages[j].length_bytes});
      slot_bytes += messages[j].length_bytes;
      ++j;
    }
    auto slot = std::make_shared<Slot>();
    slot->slots = slots_;
    slot->slot = slots_->Acquire();
    char* const staged = slots_->data(slot->slot);
    posting = copier_->CopyToHost(ranges, staged);
    if (!posting.ok()) {
      slots_->Release(slot->slot);
      break;
    }
    slot->remaining = static_cast<int>(j - i);
    {
      absl::MutexLock lock(&state->mu);
      state->remaining += static_cast<int>(j - i);
      state->bytes += static_cast<int64_t>(slot_bytes);
    }
    stats_->messages += static_cast<int64_t>(j - i);
    stats_->bytes_posted += static_cast<int64_t>(slot_bytes);
    uint64_t at = 0;
    for (size_t k = i; k < j; ++k) {
      const transport::KvMessageHeader header{.reservation_id = destination_.reservation_id(),
                                              .remote_address = messages[k].remote_address};
      endpoints_[next_lane_++ % endpoints_.size()]->Send(
          transport::kKvMessageId, header.Encode(), staged + at, messages[k].length_bytes,
          [slot, state](absl::Status s) {
            if (--slot->remaining == 0) slot->slots->Release(slot->slot);
            state->Complete(std::move(s));
          },
          rendezvous_);
      at += messages[k].length_bytes;
    }
    i = j;
  }
  state->Complete(std::move(posting));
}

}  // namespace

UcxKv::UcxKv(transport::UcxWorker* ucx, const backend::KvMemory& memory, std::string owner_id,
             uint64_t incarnation, std::unique_ptr<transport::MemoryRegion> region,
             std::unique_ptr<backend::KvCopier> copier, std::shared_ptr<StagingSlots> staging,
             uint64_t message_bytes, int max_direct_fetches)
    : ucx_(ucx),
      memory_(memory),
      owner_id_(std::move(owner_id)),
      incarnation_(incarnation),
      region_(std::move(region)),
      copier_(std::move(copier)),
      staging_(std::move(staging)),
      message_bytes_(message_bytes),
      max_direct_fetches_(max_direct_fetches) {}

absl::StatusOr<std::unique_ptr<UcxKv>> UcxKv::Create(transport::UcxWorker* ucx,
                                                     const backend::KvMemory& memory,
                                                     std::string owner_id, uint64_t incarnation,
                                                     UcxKvOptions options) {
  if (options.receive_threads < 0 || options.receive_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("receive_threads is ", options.receive_threads, "; must be 0 to 64"));
  }
  if (options.receive_buffers < 1 || options.receive_buffers > 1024 ||
      options.receive_buffer_bytes < 1 || options.receive_fetches < 1 ||
      options.direct_fetches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("receive_buffers is ", options.receive_buffers, ", receive_buffer_bytes ",
                     options.receive_buffer_bytes, ", receive_fetches ", options.receive_fetches,
                     " and direct_fetches ", options.direct_fetches,
                     "; need 1 to 1024 buffers of at least one byte and at least one fetch"));
  }
  if (options.lanes < 1 || options.lanes > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("lanes is ", options.lanes, "; must be 1 to 16"));
  }
  const bool staged = options.force_staging || (memory.device && !ucx->supports_cuda_memory());
  std::unique_ptr<transport::MemoryRegion> region;
  std::shared_ptr<StagingSlots> staging;
  uint64_t message_bytes = 0;
  if (staged) {
    if (options.copier == nullptr) {
      return absl::FailedPreconditionError(
          "the KV cache is in CUDA device memory and this UCX build has no CUDA support "
          "(ucx_info -d lists no cuda transport), and no KV copier was given to stage it "
          "through host memory");
    }
    message_bytes =
        transport::KvMessageBytes(memory.spec.block_stride_bytes(), options.max_message_bytes);
    if (options.staging_slot_bytes < message_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "staging_slot_bytes is ", options.staging_slot_bytes, "; a KV message takes ",
          message_bytes, " bytes (max_message_bytes rounded to whole blocks of ",
          memory.spec.block_stride_bytes(), ")"));
    }
    const uint64_t num_slots = options.staging_bytes / options.staging_slot_bytes;
    if (num_slots < 1 || num_slots > (1 << 20)) {
      return absl::InvalidArgumentError(absl::StrCat("staging_bytes is ", options.staging_bytes,
                                                     "; must hold 1 to 2^20 slots of ",
                                                     options.staging_slot_bytes, " bytes"));
    }
    TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<backend::HostBuffer> memory_for_slots,
                             options.copier->AllocateHost(num_slots * options.staging_slot_bytes));
    staging = std::make_shared<StagingSlots>(std::move(memory_for_slots),
                                             options.staging_slot_bytes, num_slots);
  } else {
    auto registered =
        ucx->Register(memory.base, memory.bytes,
                      memory.device ? transport::MemoryKind::kCuda : transport::MemoryKind::kHost);
    if (!registered.ok()) return registered.status();
    region = std::move(*registered);
  }
  std::unique_ptr<UcxKv> kv(new UcxKv(
      ucx, memory, std::move(owner_id), incarnation, std::move(region), std::move(options.copier),
      std::move(staging), message_bytes, options.direct_fetches * options.lanes));
  // Rendezvous receive buffers (pinned for a pool on a GPU) for pools that
  // copy messages in; a host pool fetches straight into its blocks.
  if (backend::KvCopier* copier = kv->copier_.get(); copier != nullptr) {
    const uint64_t buffer_bytes = options.receive_buffer_bytes;
    // Buffers and fetches are per lane: each lane's worker fetches its own.
    kv->receiver_ = std::make_unique<Receiver>(
        kv.get(), options.receive_buffers * options.lanes, buffer_bytes,
        [copier, buffer_bytes] { return copier->AllocateHost(buffer_bytes); },
        options.receive_threads, options.receive_fetches * options.lanes);
  }
  kv->max_message_bytes_ = options.max_message_bytes;
  for (int lane = 1; lane < options.lanes; ++lane) {
    transport::UcxOptions lane_options = ucx->options();
    lane_options.name = absl::StrCat(lane_options.name, "-lane", lane);
    TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<transport::UcxWorker> worker,
                             transport::UcxWorker::Create(lane_options));
    kv->lane_workers_.push_back(std::move(worker));
  }
  // Messages arrive on every lane; the handlers are thread-safe.
  UcxKv* raw = kv.get();
  const std::vector<transport::UcxWorker*> workers = kv->Workers();
  kv->lane_messages_ = std::make_unique<std::atomic<int64_t>[]>(workers.size());
  for (size_t lane = 0; lane < workers.size(); ++lane) {
    std::atomic<int64_t>* count = &kv->lane_messages_[lane];
    TRIDENT_RETURN_IF_ERROR(workers[lane]->SetMessageHandler(
        transport::kKvMessageId,
        [raw, count](absl::string_view header, absl::string_view data) {
          count->fetch_add(1, std::memory_order_relaxed);
          raw->CopyIn(header, data);
        },
        [raw, count](absl::string_view header,
                     std::unique_ptr<transport::IncomingMessage> message) {
          count->fetch_add(1, std::memory_order_relaxed);
          raw->OnRendezvous(header, std::move(message));
        }));
  }
  return kv;
}

std::vector<int64_t> UcxKv::messages_by_lane() const {
  std::vector<int64_t> counts;
  for (size_t lane = 0; lane < 1 + lane_workers_.size(); ++lane) {
    counts.push_back(lane_messages_[lane].load(std::memory_order_relaxed));
  }
  return counts;
}

std::vector<transport::UcxWorker*> UcxKv::Workers() const {
  std::vector<transport::UcxWorker*> workers = {ucx_};
  for (const auto& worker : lane_workers_) workers.push_back(worker.get());
  return workers;
}

UcxKv::~UcxKv() {
  // Later messages are dropped (an empty handler) once this returns.
  for (transport::UcxWorker* worker : Workers()) {
    worker->SetMessageHandler(transport::kKvMessageId, [](absl::string_view, absl::string_view) {})
        .IgnoreError();
  }
  receiver_.reset();
  absl::MutexLock lock(&sink_mu_);
  direct_waiting_.clear();  // Releases their senders.
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sink_mu_) { return direct_fetches_ == 0; };
  sink_mu_.Await(absl::Condition(&idle));
  lane_workers_.clear();  // Nothing of theirs runs any more.
}

void UcxKv::AcceptMessagesFor(KvReservations* reservations) {
  absl::MutexLock lock(&sink_mu_);
  // Fetches straight into the pool hold the old sink until they end.
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sink_mu_) { return direct_fetches_ == 0; };
  sink_mu_.Await(absl::Condition(&idle));
  sink_ = reservations;
}

absl::StatusOr<std::pair<uint64_t, uint64_t>> UcxKv::Locate(absl::string_view header_bytes,
                                                            uint64_t length) const {
  TRIDENT_ASSIGN_OR_RETURN(const transport::KvMessageHeader header,
                           transport::KvMessageHeader::Decode(header_bytes));
  const uint64_t base = reinterpret_cast<uint64_t>(memory_.base);
  const uint64_t offset = header.remote_address - base;
  if (header.remote_address < base || offset > memory_.bytes || length > memory_.bytes - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("a KV message of ", length, " bytes outside the registered KV pool"));
  }
  return std::make_pair(header.reservation_id, offset);
}

void UcxKv::OnRendezvous(absl::string_view header,
                         std::unique_ptr<transport::IncomingMessage> message) {
  if (memory_.device || staged()) {
    if (receiver_ == nullptr) {
      Dropped(absl::FailedPreconditionError(
          "KV messages into device memory need a KV copier (UcxKvOptions.copier)"));
      return;
    }
    receiver_->OnMessage(header, std::move(message));
    return;
  }
  absl::MutexLock lock(&sink_mu_);
  if (direct_fetches_ >= max_direct_fetches_) {
    direct_waiting_.emplace_back(std::string(header), std::move(message));
    return;
  }
  StartDirectFetch(header, std::move(message));
}

void UcxKv::StartDirectFetch(absl::string_view header,
                             std::unique_ptr<transport::IncomingMessage> message) {
  // A host pool: fetch straight into the reserved blocks, the reservation
  // pinned until the fetch ends. Dropping `message` releases its sender.
  const uint64_t length = message->length();
  absl::StatusOr<std::pair<uint64_t, uint64_t>> where = Locate(header, length);
  if (!where.ok()) {
    Dropped(where.status());
    return;
  }
  const auto [reservation, offset] = *where;
  if (sink_ == nullptr) {
    Dropped(absl::FailedPreconditionError("no reservations accept KV messages"));
    return;
  }
  if (absl::Status pinned = sink_->BeginMessage(reservation,
                                                [&](absl::Span<const int32_t> blocks) {
                                                  return transport::CheckKvWriteRange(
                                                      memory_.spec, offset, length, blocks);
                                                });
      !pinned.ok()) {
    Dropped(pinned);
    return;
  }
  ++direct_fetches_;
  KvReservations* sink = sink_;
  message->Receive(static_cast<char*>(memory_.base) + offset,
                   [this, sink, reservation = reservation, length](absl::Status status) {
                     if (!status.ok()) Dropped(status);
                     sink->EndMessage(reservation, status.ok() ? absl::StatusOr<int64_t>(length)
                                                               : absl::StatusOr<int64_t>(status));
                     absl::MutexLock lock(&sink_mu_);
                     --direct_fetches_;
                     while (!direct_waiting_.empty() && direct_fetches_ < max_direct_fetches_) {
                       auto next = std::move(direct_waiting_.front());
                       direct_waiting_.pop_front();
                       StartDirectFetch(next.first, std::move(next.second));
                     }
                   });
}

void UcxKv::CopyIn(absl::string_view header_bytes, absl::string_view data) {
  // Device memory (or a staged pool) goes through the copier; a host pool
  // takes a plain memcpy.
  const bool copy_in = memory_.device || staged();
  absl::StatusOr<std::pair<uint64_t, uint64_t>> where = Locate(header_bytes, data.size());
  absl::Status status = where.status();
  if (status.ok() && copy_in && copier_ == nullptr) {
    status = absl::FailedPreconditionError(
        "KV messages into device memory need a KV copier (UcxKvOptions.copier)");
  }
  if (status.ok()) {
    const auto [reservation, offset] = *where;
    absl::ReaderMutexLock lock(&sink_mu_);
    if (sink_ == nullptr) {
      status = absl::FailedPreconditionError("no reservations accept KV messages");
    } else {
      status = sink_->WriteMessage(
          reservation, [&](absl::Span<const int32_t> blocks) -> absl::StatusOr<int64_t> {
            TRIDENT_RETURN_IF_ERROR(
                transport::CheckKvWriteRange(memory_.spec, offset, data.size(), blocks));
            if (copy_in) {
              // Returns once the bytes are on the device, so that the count
              // (and the commit waiting for it) follows them.
              const backend::KvRange range{.offset_bytes = offset, .length_bytes = data.size()};
              TRIDENT_RETURN_IF_ERROR(copier_->CopyFromHost(data.data(), {&range, 1}));
            } else {
              std::memcpy(static_cast<char*>(memory_.base) + offset, data.data(), data.size());
            }
            return static_cast<int64_t>(data.size());
          });
    }
  }
  if (!status.ok()) Dropped(status);
}

void UcxKv::Dropped(const absl::Status& why) {
  const int64_t dropped = ++dropped_messages_;
  // Late messages of a dead or aborted transfer are expected; say so once in
  // a while, not per message.
  if (dropped == 1 || dropped % 1000 == 0) {
    TRIDENT_LOG(WARNING) << "dropped KV message (" << dropped << " so far): " << why;
  }
}

absl::Status UcxKv::Describe(v1::KvDestination* d) const {
  v1::TransportEndpoint* e = d->mutable_endpoint();
  e->set_owner_id(owner_id_);
  e->set_incarnation(incarnation_);
  e->set_ucx_worker_address(ucx_->address());
  for (const auto& worker : lane_workers_) e->add_lane_worker_addresses(worker->address());
  // Peers reach staged device memory through host buffers.
  e->set_memory_type(memory_.device && !staged() ? v1::MEMORY_TYPE_CUDA : v1::MEMORY_TYPE_HOST);
  *d->mutable_layout() = kv::ToProto(memory_.spec);
  v1::KvRegion* r = d->add_regions();
  r->set_base_address(reinterpret_cast<uint64_t>(memory_.base));
  r->set_length_bytes(memory_.bytes);
  r->set_rkey(staged() ? std::string(transport::kMessagesOnlyRkey) : region_->packed_rkey());
  r->set_memory_type(memory_.device ? v1::MEMORY_TYPE_CUDA : v1::MEMORY_TYPE_HOST);
  r->set_first_layer(0);
  r->set_num_layers(memory_.spec.num_layers);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::shared_ptr<transport::Endpoint>>> UcxKv::EndpointsFor(
    const v1::KvDestination& destination) {
  const v1::TransportEndpoint& peer = destination.endpoint();
  const auto key = std::make_pair(peer.owner_id(), peer.incarnation());
  {
    absl::MutexLock lock(&mu_);
    auto it = endpoints_.find(key);
    if (it != endpoints_.end() &&
        std::none_of(it->second.begin(), it->second.end(),
                     [](const auto& endpoint) { return endpoint->failed(); })) {
      return it->second;
    }
  }
  const std::vector<transport::UcxWorker*> workers = Workers();
  const size_t lanes =
      std::min(workers.size(), 1 + static_cast<size_t>(peer.lane_worker_addresses_size()));
  std::vector<std::shared_ptr<transport::Endpoint>> endpoints;
  for (size_t lane = 0; lane < lanes; ++lane) {
    TRIDENT_ASSIGN_OR_RETURN(
        std::shared_ptr<transport::Endpoint> endpoint,
        workers[lane]->Connect(
            lane == 0 ? peer.ucx_worker_address() : peer.lane_worker_addresses(lane - 1),
            lane == 0 ? peer.owner_id() : absl::StrCat(peer.owner_id(), " (lane ", lane, ")")));
    endpoints.push_back(std::move(endpoint));
  }
  // Finish UCX's connection setup on both sides before any KV goes: on
  // tcp, UCX 1.13 aborts the decode worker if this process dies while the
  // decode worker's reply to it is still queued (Endpoint::Handshake).
  struct Answers {
    absl::Mutex mu;
    size_t pending ABSL_GUARDED_BY(mu) = 0;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  auto answers = std::make_shared<Answers>();  // Callbacks may outlive a timeout.
  {
    absl::MutexLock lock(&answers->mu);
    answers->pending = endpoints.size();
  }
  for (const auto& endpoint : endpoints) {
    endpoint->Handshake([answers](absl::Status s) {
      absl::MutexLock lock(&answers->mu);
      if (!s.ok() && answers->status.ok()) answers->status = std::move(s);
      --answers->pending;
    });
  }
  {
    absl::MutexLock lock(&answers->mu);
    auto answered = [&answers]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(answers->mu) {
      return answers->pending == 0 || !answers->status.ok();
    };
    if (!answers->mu.AwaitWithTimeout(absl::Condition(&answered), kHandshakeTimeout)) {
      return absl::UnavailableError(absl::StrCat("UCX handshake with decode worker ",
                                                 peer.owner_id(), " did not finish within ",
                                                 absl::FormatDuration(kHandshakeTimeout)));
    }
    TRIDENT_RETURN_IF_ERROR(answers->status);
  }
  absl::MutexLock lock(&mu_);
  endpoints_[key] = endpoints;
  return endpoints;
}

absl::Status UcxKv::Connect(const v1::KvDestination& destination) {
  return EndpointsFor(destination).status();
}

absl::StatusOr<std::unique_ptr<KvTransfer>> UcxKv::Open(const v1::KvDestination& destination) {
  TRIDENT_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<transport::Endpoint>> endpoints,
                           EndpointsFor(destination));
  if (staged()) {
    TRIDENT_RETURN_IF_ERROR(transport::ValidateKvDestination(memory_.spec, destination));
    return std::unique_ptr<KvTransfer>(new StagedTransfer(
        memory_.spec, copier_.get(), staging_, std::move(endpoints), destination, message_bytes_));
  }
  std::shared_ptr<transport::Endpoint> main = endpoints.front();
  endpoints.erase(endpoints.begin());
  auto writer = transport::KvWriter::Create(memory_.spec, memory_.base, main, destination,
                                            transport::WriteModeFor(destination, main->lane()),
                                            max_message_bytes_, std::move(endpoints));
  if (!writer.ok()) return writer.status();
  return std::unique_ptr<KvTransfer>(new UcxTransfer(std::move(*writer)));
}

}  // namespace trident::worker
