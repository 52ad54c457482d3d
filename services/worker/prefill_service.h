// trident.v1.Prefill on a worker: computes a prompt (a prefill_only engine
// request), streams its first token, writes its KV into the decode worker's
// reserved blocks through a KvSender, hands the reservation over with
// Decode.CommitKv, and only then frees its own blocks.
//
// Transfers run on the service's transfer thread, one at a time, layer by
// layer after the prompt is computed. (Overlapping a layer's transfer with
// the next layers' compute needs a per-layer signal from the backend; not
// yet.)

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
  // Longest wait for a transfer's posted sends to complete before the call
  // fails (and its blocks are freed).
  absl::Duration drain_timeout = absl::Seconds(10);
  // How often the renewal thread renews the KV reservations of calls not
  // yet handed over once less than half of their lease is left
  // (LeaseKeeper). Zero: no thread (tests call RenewDueLeases).
  absl::Duration lease_renew_period = absl::Seconds(1);
};

// Thread-safe.
class PrefillService final : public trident::v1::Prefill::CallbackService {
 public:
  // `engine`, `sender` (may be null: requests with a destination then fail
  // with FAILED_PRECONDITION) and `clock` must outlive the service.
  PrefillService(engine::Engine* engine, const trident::v1::ModelInfoResponse& model_info,
                 transport::KvSender* sender, const Clock* clock, PrefillServiceOptions options);
  // Finishes the queued transfers (aborting them) and joins the thread.
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
  // Prefill's steps. Admits the call and converts the request; checks its
  // destination (INVALID_ARGUMENT naming the field, FAILED_PRECONDITION
  // without a KV transport).
  absl::StatusOr<engine::EngineRequest> Prepare(const std::shared_ptr<Call>& call,
                                                const trident::v1::PrefillRequest& request);
  // Keeps the destination's lease, sends each layer as it is computed and
  // connects to the decode worker while the prompt computes.
  void KeepDestination(const std::shared_ptr<Call>& call, engine::EngineRequest& request);
  // The engine's one event for the call (on the engine's thread): streams
  // the first token, then hands the rest to the transfer thread.
  void OnPrefillEvent(const std::shared_ptr<Call>& call, bool logprobs,
                      const engine::TokenEvent& event);
  // The first token ended the sequence: hands the reservation over as
  // FINISHED and completes the call. On the transfer thread.
  void FinishAtFirstToken(Call& call, trident::v1::FinishReason reason);
  // The prefill failed or was cancelled: gives the reservation up (ABORTED)
  // and ends the call with `why`. On the transfer thread.
  void AbortCall(Call& call, const absl::Status& why);
  // Runs `job` on the transfer thread.
  void Enqueue(std::function<void()> job);
  // Posts layer `layer` of the call's KV (opening the transfer at the
  // first); layers go in order, and one out of order is left to Transfer.
  // On the transfer thread.
  void SendLayer(const std::shared_ptr<Call>& call, int32_t layer,
                 const std::vector<int32_t>& blocks);
  // Waits for the call's posted layers; the first send error.
  absl::Status DrainSends(Call& call);
  // The rest of the transfer and the hand-off of a computed prompt; on the
  // transfer thread.
  void Transfer(std::shared_ptr<Call> call, std::vector<int32_t> blocks);
  // Decode.CommitKv to the call's decode worker; its lease is no longer
  // kept from then on.
  absl::Status Commit(const Call& call, const trident::v1::CommitKvRequest& request);
  std::shared_ptr<trident::v1::Decode::Stub> StubFor(const std::string& address);
  // Decode.RenewKv (LeaseKeeper::RenewFn).
  absl::StatusOr<absl::Duration> Renew(const trident::v1::KvDestination& destination,
                                       absl::Duration lease);

  engine::Engine* const engine_;
  const trident::v1::ModelInfoResponse model_info_;
  transport::KvSender* const sender_;
  const Clock* const clock_;
  const PrefillServiceOptions options_;
  std::unique_ptr<WorkerRole> own_role_;
  WorkerRole* const role_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<trident::v1::Decode::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
  std::thread transfer_thread_;
  LeaseKeeper leases_;
  std::thread renew_thread_;
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_PREFILL_SERVICE_H_
