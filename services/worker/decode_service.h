// trident.v1.Decode on a worker: KV reservations for prompts a prefill
// worker computes (ReserveKv, RenewKv, CommitKv, ReleaseKv, on
// KvReservations) and the Decode stream, which waits for the reservation's
// hand-off, then continues the sequence in the engine from its first token
// (or, without a reservation in role `both`, runs the whole request).
//
// The service owns neither the reservations nor the KV transport: the
// worker server (worker_server.h) owns both and hands the same
// KvReservations to this service and, as its KvMessageSink, to the
// transport, whose KvReceiver describes the pool in ReserveKv replies.

#ifndef TRIDENT_SERVICES_WORKER_DECODE_SERVICE_H_
#define TRIDENT_SERVICES_WORKER_DECODE_SERVICE_H_

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/engine.h"
#include "common/time/clock.h"
#include "common/transport/kv/kv_receiver.h"
#include "services/worker/kv_handoff/kv_reservations.h"
#include "services/worker/worker_role.h"
#include "trident/v1/generation.pb.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident::worker {

struct DecodeServiceOptions {
  std::string worker_id;
  uint64_t incarnation = 0;
  // host:port peers use for CommitKv and RenewKv.
  std::string address;
  // The worker's role, shared with its other services and changed by
  // WorkerControl.SetRole; must outlive the service. Null: a role of the
  // service's own, fixed at `role`.
  WorkerRole* worker_role = nullptr;
  trident::v1::Role role = trident::v1::ROLE_DECODE;
  // How long a COMPLETE commit waits for KV messages still on their way
  // (CommitKvRequest.message_bytes) before failing with DATA_LOSS; checked
  // every lease_check_interval, on the service's clock. The wait holds no
  // thread: CommitKv answers from the write that completes the bytes.
  absl::Duration message_arrival_timeout = absl::Seconds(10);
  // How often leases are checked for expiry.
  absl::Duration lease_check_interval = absl::Milliseconds(100);
  // Places prompts at CPU attention services (the worker's offload; must
  // outlive the service). Null: every reservation is in this worker's
  // blocks. With one, a request that allows CPU attention goes there when
  // it is long (PromptPlacer::PlacesOnCpu) or the blocks are short.
  PromptPlacer* placer = nullptr;
};

// Thread-safe.
class DecodeService final : public trident::v1::Decode::CallbackService {
 public:
  // `engine`, `reservations` (whose blocks come from `engine`), `receiver`
  // (may be null: no KV transport, ReserveKv then answers
  // FAILED_PRECONDITION) and `clock` are not owned and must outlive the
  // service. Starts the lease checker.
  DecodeService(engine::Engine* engine, const trident::v1::ModelInfoResponse& model_info,
                KvReservations* reservations, transport::KvReceiver* receiver, const Clock* clock,
                DecodeServiceOptions options);
  // Stops the lease checker.
  ~DecodeService() override;

  grpc::ServerUnaryReactor* ReserveKv(grpc::CallbackServerContext* context,
                                      const trident::v1::ReserveKvRequest* request,
                                      trident::v1::ReserveKvResponse* response) override;
  grpc::ServerUnaryReactor* RenewKv(grpc::CallbackServerContext* context,
                                    const trident::v1::RenewKvRequest* request,
                                    trident::v1::RenewKvResponse* response) override;
  grpc::ServerUnaryReactor* CommitKv(grpc::CallbackServerContext* context,
                                     const trident::v1::CommitKvRequest* request,
                                     trident::v1::CommitKvResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseKv(grpc::CallbackServerContext* context,
                                      const trident::v1::ReleaseKvRequest* request,
                                      trident::v1::ReleaseKvResponse* response) override;
  grpc::ServerWriteReactor<trident::v1::DecodeResponse>* Decode(
      grpc::CallbackServerContext* context, const trident::v1::DecodeRequest* request) override;

  // Frees the reservations whose lease ended; the lease checker's work
  // (every `lease_check_interval`), which tests on a fake clock call.
  void ExpireLeases();

 private:
  // The commit a CommitKv request describes: FAILED_PRECONDITION for another
  // incarnation, INVALID_ARGUMENT naming the field for a malformed one.
  absl::StatusOr<KvCommit> CommitFrom(const trident::v1::CommitKvRequest& request) const;
  absl::Status CheckIncarnation(uint64_t incarnation) const;
  // ReserveKv's steps: its checks (filling `call`); a reservation in this
  // worker's blocks (described by the receiver), or, when they are full and
  // `place_if_full`, at an attention service; a placement at an attention
  // service (described by the placer), or when the services refuse it, in
  // the blocks, unless `if_refused` holds the blocks' own refusal to answer
  // with; the answer.
  struct ReserveCall;
  absl::Status CheckReserve(ReserveCall& call);
  void ReserveInBlocks(std::unique_ptr<ReserveCall> call, bool place_if_full);
  void PlaceAtService(std::unique_ptr<ReserveCall> call, std::optional<absl::Status> if_refused);
  void FinishReserve(std::unique_ptr<ReserveCall> call,
                     absl::StatusOr<KvReservations::Reservation> r);
  // The work of reservation `id` (admitted by ReserveKv), for its Decode
  // call to carry on; inactive if there is none.
  WorkerRole::Work TakeReservationWork(uint64_t id);
  // Ends the work of reservations that ended without a Decode call
  // (released, expired).
  void EndFinishedReservationWork();

  engine::Engine* const engine_;
  const trident::v1::ModelInfoResponse model_info_;
  KvReservations* const reservations_;
  transport::KvReceiver* const receiver_;
  const Clock* const clock_;
  const DecodeServiceOptions options_;
  std::unique_ptr<WorkerRole> own_role_;
  WorkerRole* const role_;
  absl::Mutex work_mu_;
  // Reservations awaiting their Decode call, by id.
  absl::flat_hash_map<uint64_t, WorkerRole::Work> reservation_work_ ABSL_GUARDED_BY(work_mu_);
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread lease_checker_;
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_DECODE_SERVICE_H_
