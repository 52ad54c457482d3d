// trident.v1.Prefill on a worker: computes a prompt (a prefill_only engine
// request), streams its first token, writes its KV into the decode worker's
// reserved blocks through a KvSender, hands the reservation over with
// Decode.CommitKv, and only then frees its own blocks.
//
// Each layer's KV goes as soon as the backend reports it computed, while the
// later layers still compute (layer-wise overlap); what was not reported
// goes once the prompt is done. Transfers to one decode worker run in order
// on that destination's own queue (a thread per decode worker this worker
// has sent to, not per request), and the hand-off (CommitKv) is an
// asynchronous call: a decode worker that stalls or dies holds up only the
// prompts bound for it, never those of other decode workers.

#ifndef TRIDENT_SERVICES_WORKER_PREFILL_SERVICE_H_
#define TRIDENT_SERVICES_WORKER_PREFILL_SERVICE_H_

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/engine.h"
#include "common/time/clock.h"
#include "common/transport/kv/kv_sender.h"
#include "services/worker/kv_handoff/lease_keeper.h"
#include "services/worker/worker_role.h"
#include "trident/v1/generation.pb.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident::worker {

struct PrefillServiceOptions {
  std::string worker_id;
  // The worker's role, shared with its other services and changed by
  // WorkerControl.SetRole; must outlive the service. Null: a role of the
  // service's own, fixed at `role`.
  WorkerRole* worker_role = nullptr;
  trident::v1::Role role = trident::v1::ROLE_PREFILL;
  // Deadline of each CommitKv call to a decode worker.
  absl::Duration commit_timeout = absl::Seconds(10);
  // Fault injection for tests (--testonly_stall_kv_transfer_after_layers):
  // when >= 0, each transfer stops after posting that many layers and waits
  // for its call to be cancelled, so that a test can kill this worker
  // mid-transfer. -1: off.
  int32_t testonly_stall_after_layers = -1;
  // With testonly_stall_after_layers: only transfers to the decode worker of
  // this id stall (--testonly_stall_kv_transfer_to); empty: every transfer.
  std::string testonly_stall_to_decode_worker;
  // Longest wait for a transfer's posted sends to complete before the call
  // fails (and its blocks are freed).
  absl::Duration drain_timeout = absl::Seconds(10);
  // How often the renewal thread renews the KV reservations of calls not
  // yet handed over once less than half of their lease is left
  // (LeaseKeeper). Zero: no thread (tests call RenewDueLeases).
  absl::Duration lease_renew_period = absl::Seconds(1);
  // Where prompts are submitted and aborted: the engine, or a source in
  // front of it (the KV tier's TieredTokenSource, which fetches a prompt's
  // blocks from the DRAM tier first). Null: the engine. Must outlive the
  // service.
  engine::TokenSource* token_source = nullptr;
};

// Thread-safe.
class PrefillService final : public trident::v1::Prefill::CallbackService {
 public:
  // `engine`, `sender` (may be null: requests with a destination then fail
  // with FAILED_PRECONDITION) and `clock` must outlive the service.
  PrefillService(engine::Engine* engine, const trident::v1::ModelInfoResponse& model_info,
                 transport::KvSender* sender, const Clock* clock, PrefillServiceOptions options);
  // Finishes the queued transfers (aborting them), joins the destinations'
  // threads and waits for the hand-offs in flight.
  ~PrefillService() override;

  grpc::ServerWriteReactor<trident::v1::PrefillResponse>* Prefill(
      grpc::CallbackServerContext* context, const trident::v1::PrefillRequest* request) override;

  // Renews the leases that are due (LeaseKeeper::RenewDue); the renewal
  // thread's work. Returns how many were renewed.
  int RenewDueLeases() { return leases_.RenewDue(); }
  // KV reservations whose leases this worker keeps (calls not handed over).
  int LeasesKeptForTesting() const { return leases_.size(); }

 private:
  struct Call;
  // The jobs of the transfers to one decode worker, run in order on its
  // thread.
  struct DestinationQueue {
    std::deque<std::function<void()>> jobs;
    std::thread thread;
  };

  // Prefill's steps: the role's admission and the request checked and
  // converted (INVALID_ARGUMENT naming the field, FAILED_PRECONDITION
  // without a KV transport); the destination's lease kept and its layers
  // sent as they complete; the engine's one event for the prompt.
  absl::StatusOr<engine::EngineRequest> PrepareRequest(const std::shared_ptr<Call>& call,
                                                       const trident::v1::PrefillRequest& request);
  void WatchDestination(const std::shared_ptr<Call>& call, engine::EngineRequest* request);
  void OnPrefillEvent(const std::shared_ptr<Call>& call, bool logprobs,
                      const engine::TokenEvent& ev);
  // The first token ended the request: the reservation is handed back as
  // FINISHED and the call completes.
  void FinishAtFirstToken(const std::shared_ptr<Call>& call, trident::v1::FinishReason reason);
  // The engine failed or dropped the prompt: the reservation is abandoned.
  void AbortAfterEngineFailure(const std::shared_ptr<Call>& call, const absl::Status& why);

  // Runs `job` on the queue of the call's decode worker.
  void Enqueue(const Call& call, std::function<void()> job) ABSL_LOCKS_EXCLUDED(mu_);
  void RunQueue(DestinationQueue* queue) ABSL_LOCKS_EXCLUDED(mu_);
  // Posts layer `layer` of the call's KV (opening the transfer at the
  // first); layers go in order, and one out of order is left to Transfer.
  // On the destination's queue.
  void SendLayer(const std::shared_ptr<Call>& call, int32_t layer,
                 const std::vector<int32_t>& blocks);
  // Waits for the call's posted layers; the first send error.
  absl::Status DrainSends(Call& call);
  // The rest of the transfer and the hand-off of a computed prompt; on the
  // destination's queue.
  void Transfer(std::shared_ptr<Call> call, std::vector<int32_t> blocks);
  // Abandons the call's reservation (COMMIT_OUTCOME_ABORTED), frees the
  // prompt's blocks and ends the call with ABORTED saying `why`.
  void FailTransfer(const std::shared_ptr<Call>& call, const absl::Status& why);
  // The commit request for the call's reservation, with `outcome`.
  trident::v1::CommitKvRequest CommitRequest(const Call& call,
                                             trident::v1::CommitOutcome outcome) const;
  // Decode.CommitKv to the call's decode worker, without waiting; `done`
  // gets its result on a gRPC thread. The lease is no longer kept from
  // then on.
  void Commit(const std::shared_ptr<Call>& call, trident::v1::CommitKvRequest request,
              std::function<void(absl::Status)> done) ABSL_LOCKS_EXCLUDED(mu_);
  std::shared_ptr<trident::v1::Decode::Stub> StubFor(const std::string& address)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Decode.RenewKv (LeaseKeeper::RenewFn).
  absl::StatusOr<absl::Duration> Renew(const trident::v1::KvDestination& destination,
                                       absl::Duration lease);
  bool StallsTransferTo(const Call& call, int32_t layer) const;

  engine::Engine* const engine_;
  // options.token_source, or the engine.
  engine::TokenSource* const source_;
  const trident::v1::ModelInfoResponse model_info_;
  transport::KvSender* const sender_;
  const Clock* const clock_;
  const PrefillServiceOptions options_;
  std::unique_ptr<WorkerRole> own_role_;
  WorkerRole* const role_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // By decode address ("" for calls without a destination).
  absl::flat_hash_map<std::string, std::unique_ptr<DestinationQueue>> queues_ ABSL_GUARDED_BY(mu_);
  int commits_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::shared_ptr<trident::v1::Decode::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
  LeaseKeeper leases_;
  std::thread renew_thread_;
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_PREFILL_SERVICE_H_
