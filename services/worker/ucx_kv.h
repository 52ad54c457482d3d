// The worker's KV transport over UCX (common/transport): the decode side
// exports its KV pool (one registered region covering every layer, its rkey
// and the UCX worker's address, in each ReserveKv reply); the prefill side
// connects to a destination's endpoint (one endpoint per peer incarnation,
// reused) and writes layers with transport::KvWriter.
//
// Staging: a KV pool in CUDA device memory that UCX cannot register (UCX
// built without CUDA support) is staged through host memory with a
// backend::KvCopier. The decode side then exports its region as taking KV
// messages only (transport::kMessagesOnlyRkey) and copies each message into
// the device blocks (KvCopier::CopyFromHost); the prefill side copies each
// layer's blocks out (KvCopier::CopyToHost) into pinned staging slots and
// sends them from there as KV messages, the same messages KvWriter's
// kMessage mode sends:
//
//   SendLayer(l):  for each slot's worth of the layer's messages:
//                    wait for a free slot (back-pressure)
//                    CopyToHost(the messages' runs) -> slot
//                    Send(each message) -- the slot is free again once
//                                          every message in it was sent
//
// SendLayer returns once the layer is copied out and its messages posted,
// so the caller's next SendLayer copies layer l + 1 while UCX sends layer l.
#ifndef TRIDENT_SERVICES_WORKER_UCX_KV_H_
#define TRIDENT_SERVICES_WORKER_UCX_KV_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/backend/kv_copier.h"
#include "common/backend/model_backend.h"
#include "common/transport/ucx_worker.h"
#include "services/worker/decode_service.h"
#include "services/worker/kv_sender.h"

namespace trident::worker {

struct UcxKvOptions {
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
  // transport::RendezvousForLane) are fetched into `receive_buffers` buffers
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
class UcxKv final : public KvExporter, public KvSender {
 public:
  // Registers `memory` (the backend's KV pool) with `ucx`, which must outlive
  // this; or, for a device pool UCX cannot register (or with
  // options.force_staging), sets up staging instead. FAILED_PRECONDITION
  // when staging is needed and options.copier is null; INVALID_ARGUMENT
  // naming the option for staging slots smaller than one message or
  // staging_bytes smaller than one slot; the copier's errors for the staging
  // memory.
  static absl::StatusOr<std::unique_ptr<UcxKv>> Create(transport::UcxWorker* ucx,
                                                       const backend::KvMemory& memory,
                                                       std::string owner_id, uint64_t incarnation,
                                                       UcxKvOptions options = {});

  // KvExporter.
  absl::Status Describe(trident::v1::KvDestination* destination) const override;
  void AcceptMessagesFor(KvReservations* reservations) override;

  ~UcxKv() override;

  // KV messages dropped: late ones of ended transfers, or invalid ones.
  int64_t dropped_messages() const { return dropped_messages_.load(); }
  // KV messages that arrived on each lane (UcxKvOptions::lanes), kept or not.
  std::vector<int64_t> messages_by_lane() const;
  // Whether the pool is staged through host memory (see the file comment).
  bool staged() const { return staging_ != nullptr; }

  // KvSender. A staged transfer's SendLayer copies the layer out (returning
  // once its messages are posted) and waits while every staging slot is in
  // flight, so it must not run on the UCX worker's progress thread.
  // Transfers must not outlive this UcxKv (their callbacks may).
  int32_t num_layers() const override { return memory_.spec.num_layers; }
  absl::StatusOr<std::unique_ptr<KvTransfer>> Open(
      const trident::v1::KvDestination& destination) override;
  // Creates (once per decode worker incarnation) the endpoint to the
  // destination's worker and completes a handshake on it
  // (transport::Endpoint::Handshake): over tcp, UCX 1.13.1 aborts the decode
  // worker if this process dies while the decode worker's reply to UCX's
  // connection request is still queued, so nothing goes before the decode
  // worker has answered.
  absl::Status Connect(const trident::v1::KvDestination& destination) override;

  // Staged transfers' slots (ucx_kv.cc).
  class StagingSlots;

 private:
  // Receives KV messages sent by rendezvous (ucx_kv.cc).
  class Receiver;

  // Checks one KV message against its reservation and copies it in: the
  // handler of eager messages (progress thread), and the receive threads'
  // work.
  void CopyIn(absl::string_view header, absl::string_view data);
  // The rendezvous handler (progress thread): fetches a message straight
  // into a host pool, else hands it to receiver_.
  void OnRendezvous(absl::string_view header, std::unique_ptr<transport::IncomingMessage> message);
  // A KV message's reservation id and byte offset in the pool;
  // INVALID_ARGUMENT for a bad header or a range outside the pool.
  absl::StatusOr<std::pair<uint64_t, uint64_t>> Locate(absl::string_view header,
                                                       uint64_t length) const;
  // The given worker, then the lanes' own.
  std::vector<transport::UcxWorker*> Workers() const;
  // Starts fetching a rendezvous message straight into a host pool.
  void StartDirectFetch(absl::string_view header,
                        std::unique_ptr<transport::IncomingMessage> message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sink_mu_);
  // The endpoints to the destination's worker and to its lanes (as many as
  // both sides have), each handshaken (Connect); the first is the main one.
  absl::StatusOr<std::vector<std::shared_ptr<transport::Endpoint>>> EndpointsFor(
      const trident::v1::KvDestination& destination);
  // Counts (and now and then logs) a dropped KV message.
  void Dropped(const absl::Status& why);

  UcxKv(transport::UcxWorker* ucx, const backend::KvMemory& memory, std::string owner_id,
        uint64_t incarnation, std::unique_ptr<transport::MemoryRegion> region,
        std::unique_ptr<backend::KvCopier> copier, std::shared_ptr<StagingSlots> staging,
        uint64_t message_bytes, int max_direct_fetches);

  transport::UcxWorker* const ucx_;
  // The message lanes' own workers (UcxKvOptions::lanes - 1) and the
  // largest KV message sent; set at Create.
  std::vector<std::unique_ptr<transport::UcxWorker>> lane_workers_;
  uint64_t max_message_bytes_ = 0;
  const backend::KvMemory memory_;
  const std::string owner_id_;
  const uint64_t incarnation_;
  // The registered pool; null when staged.
  const std::unique_ptr<transport::MemoryRegion> region_;
  // Null for a host pool that is not staged.
  const std::unique_ptr<backend::KvCopier> copier_;
  // Staged sending; null when not staged. Shared with in-flight sends.
  const std::shared_ptr<StagingSlots> staging_;
  const uint64_t message_bytes_;
  // Where KV messages go; held (shared) while one is copied in.
  absl::Mutex sink_mu_;
  KvReservations* sink_ ABSL_GUARDED_BY(sink_mu_) = nullptr;
  // Fetches straight into the pool still running (they use sink_), at most
  // max_direct_fetches_; the messages waiting for one.
  const int max_direct_fetches_;
  int direct_fetches_ ABSL_GUARDED_BY(sink_mu_) = 0;
  std::deque<std::pair<std::string, std::unique_ptr<transport::IncomingMessage>>> direct_waiting_
      ABSL_GUARDED_BY(sink_mu_);
  std::atomic<int64_t> dropped_messages_{0};
  // Per lane (messages_by_lane); sized at Create.
  std::unique_ptr<std::atomic<int64_t>[]> lane_messages_;
  // Set once at Create when there is a copier (copying pools); else null.
  std::unique_ptr<Receiver> receiver_;
  absl::Mutex mu_;
  // Endpoints (EndpointsFor) by (owner id, incarnation): a new incarnation
  // gets new ones.
  absl::flat_hash_map<std::pair<std::string, uint64_t>,
                      std::vector<std::shared_ptr<transport::Endpoint>>>
      endpoints_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_UCX_KV_H_
