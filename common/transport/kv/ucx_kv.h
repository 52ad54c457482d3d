// The KV data plane over UCX: KvReceiver and KvSender in one object per
// worker, on UcxLanes (common/transport/ucx_lanes.h).
//
// Receiving (the decode side): Describe names the KV pool (one registered
// region covering every layer, its rkey, the lanes' worker addresses) for
// each ReserveKv reply. Peers write it with one-sided puts, or send KV
// messages (kv_writer.h's kMessage mode), which arrive on every lane and go
// into the KvMessageSink given at Create (the decode worker's reservations):
//
//   eager message       -> CopyIn: check against the reservation, copy in
//   rendezvous message  -> host pool: fetched straight into the blocks
//                          (the reservation pinned until the fetch ends)
//                       -> device or staged pool: RendezvousReceiver
//                          (receive buffers, receive threads) -> CopyIn
//
// Sending (the prefill side): Open connects to a destination's lanes
// (UcxLanes::EndpointsTo, once per peer incarnation) and writes layers with
// KvWriter, or, for a pool staged through host memory, with
// StagedKvTransfer (kv_staging.h).
//
// Staging: a KV pool in CUDA device memory that UCX cannot register (UCX
// built without CUDA support) is staged through host memory with a
// backend::KvCopier. The decode side then describes its region as taking KV
// messages only (kMessagesOnlyRkey) and copies each message into the device
// blocks (KvCopier::CopyFromHost); the prefill side copies each layer's
// blocks out into pinned staging slots and sends them from there.
#ifndef TRIDENT_COMMON_TRANSPORT_KV_UCX_KV_H_
#define TRIDENT_COMMON_TRANSPORT_KV_UCX_KV_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/backend/kv_copier.h"
#include "common/backend/model_backend.h"
#include "common/transport/kv/kv_message_sink.h"
#include "common/transport/kv/kv_receiver.h"
#include "common/transport/kv/kv_sender.h"
#include "common/transport/ucx_lanes.h"
#include "common/transport/ucx_worker.h"
#include "trident/v1/worker.pb.h"

namespace trident::transport {

class RendezvousReceiver;
class StagingSlots;

struct UcxKvOptions {
  // Where received KV messages go (not owned; must outlive the UcxKv); null:
  // every message is dropped (a sender only).
  KvMessageSink* sink = nullptr;
  // Copies between the KV pool and host memory (ModelBackend::CreateKvCopier).
  // Required to stage (see the file comment), and to receive KV messages into
  // a device pool; unused for a host pool that is not staged.
  std::unique_ptr<backend::KvCopier> copier;
  // Stage even where UCX could register the pool (tests, benchmarks): a host
  // pool then takes the staged path too.
  bool force_staging = false;
  // Staged sending: `staging_bytes` of host memory (KvCopier::AllocateHost,
  // at Create) in slots of `staging_slot_bytes`, each holding at least one
  // message.
  uint64_t staging_bytes = uint64_t{256} << 20;
  uint64_t staging_slot_bytes = uint64_t{16} << 20;
  // Largest KV message (rounded down to whole blocks) of a staged sender.
  uint64_t max_message_bytes = uint64_t{4} << 20;
  // KV messages that come by rendezvous (shared-memory lanes:
  // RendezvousForLane) are fetched into `receive_buffers` buffers
  // per lane of `receive_buffer_bytes` (pinned when the pool is on a GPU),
  // and copied from there into the pool by `receive_threads` threads while
  // UCX fetches the next (0: on the UCX progress thread). A message larger
  // than a buffer is dropped (senders send at most max_message_bytes, 4 MiB
  // by default). Buffers are allocated on first use. At most
  // `receive_fetches` messages per lane are fetched at once (UCX interleaves
  // concurrent fetches, which then end together in bursts; on an H200 host 4
  // moved 6.5 GB/s into a GPU pool against 5.3-6.4 for 1: bench/RESULTS.md).
  // A host pool takes rendezvous messages straight into its blocks, with no
  // buffers, at most `direct_fetches` per lane at once: there nothing
  // follows a fetch, and more at once move more (on an H200 host, two lanes
  // moved 10.3 GB/s with 64 in all against 5.5 with 8: bench/RESULTS.md).
  int direct_fetches = 32;
  int receive_threads = 2;
  // Message lanes (TransportEndpoint.lane_worker_addresses): 1 sends and
  // receives KV messages on the given UcxWorker only; each lane more is a
  // UcxWorker of this UcxKv's own (with the given worker's options), whose
  // progress thread copies messages too, sending and receiving. Where one
  // worker's copying is the limit (shared memory, tcp) two lanes move about
  // twice as much (bench/RESULTS.md). A transfer uses the smaller of the
  // sender's and the receiver's lane counts. 1 to 16.
  int lanes = 1;
  int receive_buffers = 8;
  int receive_fetches = 4;
  uint64_t receive_buffer_bytes = uint64_t{4} << 20;
};

// Thread-safe.
class UcxKv final : public KvReceiver, public KvSender {
 public:
  // Registers `memory` (the backend's KV pool) with `ucx`, which must
  // outlive this; or, for a device pool UCX cannot register (or with
  // options.force_staging), sets up staging instead; then starts taking KV
  // messages on every lane. FAILED_PRECONDITION when staging is needed and
  // options.copier is null; INVALID_ARGUMENT naming the option for receive
  // settings out of range, lanes outside 1 to 16, staging slots smaller than
  // one message or staging_bytes smaller than one slot; the copier's errors
  // for the staging memory; UcxWorker's errors (registration, lanes).
  static absl::StatusOr<std::unique_ptr<UcxKv>> Create(UcxWorker* ucx,
                                                       const backend::KvMemory& memory,
                                                       std::string owner_id, uint64_t incarnation,
                                                       UcxKvOptions options = {});

  // Stops taking messages (later ones are dropped), waits for those being
  // copied or fetched in, then closes the lanes. Transfers must not outlive
  // this (their callbacks may).
  ~UcxKv() override;

  UcxKv(const UcxKv&) = delete;
  UcxKv& operator=(const UcxKv&) = delete;

  // KvReceiver. Never fails.
  absl::Status Describe(trident::v1::KvDestination* destination) const override;
  // KV messages dropped: late ones of ended reservations, ones that failed
  // to arrive, invalid ones.
  int64_t dropped_messages() const override { return dropped_messages_.load(); }

  // KvSender. A staged transfer's SendLayer copies the layer out (returning
  // once its messages are posted) and waits while every staging slot is in
  // flight, so it must not run on a UCX progress thread.
  int32_t num_layers() const override { return memory_.spec.num_layers; }
  absl::StatusOr<std::unique_ptr<KvTransfer>> Open(
      const trident::v1::KvDestination& destination) override;
  // Creates (once per decode worker incarnation) the endpoints to the
  // destination's lanes and completes a handshake on each
  // (UcxLanes::EndpointsTo), so that nothing goes before the decode worker
  // has answered.
  absl::Status Connect(const trident::v1::KvDestination& destination) override;

  // KV messages that arrived on each lane (UcxKvOptions::lanes), kept or not.
  std::vector<int64_t> messages_by_lane() const;
  // Whether the pool is staged through host memory (see the file comment).
  bool staged() const { return staging_ != nullptr; }

 private:
  UcxKv(const backend::KvMemory& memory, std::string owner_id, uint64_t incarnation,
        KvMessageSink* sink, std::unique_ptr<backend::KvCopier> copier, uint64_t message_bytes,
        uint64_t max_message_bytes, int max_direct_fetches);

  // Create's steps: the pool registered, or the staging slots.
  absl::Status SetUpPool(UcxWorker* ucx, const UcxKvOptions& options, bool staged);
  // The message handlers on every lane, and the receive buffers of a pool
  // that copies messages in.
  absl::Status StartReceiving(const UcxKvOptions& options);

  // Checks one KV message against its reservation and copies it in: the
  // handler of eager messages (progress thread), and the receive threads'
  // work.
  void CopyIn(absl::string_view header, absl::string_view data);
  // The rendezvous handler (progress thread): fetches a message straight
  // into a host pool, else hands it to receiver_.
  void OnRendezvous(absl::string_view header, std::unique_ptr<IncomingMessage> message);
  // A KV message's reservation id and byte offset in the pool;
  // INVALID_ARGUMENT for a bad header or a range outside the pool.
  absl::StatusOr<std::pair<uint64_t, uint64_t>> Locate(absl::string_view header,
                                                       uint64_t length) const;
  // Starts fetching a rendezvous message straight into a host pool.
  void StartDirectFetch(absl::string_view header, std::unique_ptr<IncomingMessage> message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(direct_mu_);
  // A direct fetch ended: counts it, then starts those waiting.
  void EndDirectFetch(uint64_t reservation, const absl::StatusOr<int64_t>& wrote);
  // Counts (and now and then logs) a dropped KV message.
  void Dropped(const absl::Status& why);

  const backend::KvMemory memory_;
  const std::string owner_id_;
  const uint64_t incarnation_;
  // Where KV messages go; null: they are dropped.
  KvMessageSink* const sink_;
  // Null for a host pool that is not staged.
  const std::unique_ptr<backend::KvCopier> copier_;
  // Staged KV messages' size, and the largest message KvWriter sends.
  const uint64_t message_bytes_;
  const uint64_t max_message_bytes_;
  // Set at Create; destroyed last (the destructor resets it).
  std::unique_ptr<UcxLanes> lanes_;
  // The registered pool; null when staged.
  std::unique_ptr<MemoryRegion> region_;
  // Staged sending; null when not staged. Shared with in-flight sends.
  std::shared_ptr<StagingSlots> staging_;
  // Fetches straight into the pool still running (they pin their
  // reservations in sink_), at most max_direct_fetches_; the messages
  // waiting for one.
  absl::Mutex direct_mu_;
  const int max_direct_fetches_;
  int direct_fetches_ ABSL_GUARDED_BY(direct_mu_) = 0;
  std::deque<std::pair<std::string, std::unique_ptr<IncomingMessage>>> direct_waiting_
      ABSL_GUARDED_BY(direct_mu_);
  std::atomic<int64_t> dropped_messages_{0};
  // Per lane (messages_by_lane); sized at Create.
  std::unique_ptr<std::atomic<int64_t>[]> lane_messages_;
  // Set once at Create when there is a copier (copying pools); else null.
  std::unique_ptr<RendezvousReceiver> receiver_;
};

}  // namespace trident::transport

#endif  // TRIDENT_COMMON_TRANSPORT_KV_UCX_KV_H_
