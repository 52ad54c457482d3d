// One request the router runs on its workers, from admission to its final
// event: the resume record a migration continues from (prompt, tokens
// streamed, sampling state), the attempt in progress on a (prefill,
// decode) pair, and the ordered delivery of its events to the client.
//
//   Reserve ─ ReserveKv ──RESOURCE_EXHAUSTED──▶ owner's WaitForKv
//               │ ok
//               ▼
//   Decode stream (read from the start) + Prefill stream into the
//   reservation: the prefill's first token is the next output, the decode
//   stream's tokens follow.
//               │ a worker failed (migration.h), or the decode stream
//               │ stalled (no token within stall_timeout)
//               ▼
//   both calls ended ──limit left──▶ owner's Migrate: admitted again away
//               │                    from the failed worker, with prompt +
//               │                    streamed tokens (resumed_outputs);
//               │                    the client's stream goes on
//               ▼ limit reached / not migratable
//   the final event carries the worker's status.
//
// A request that already streamed its last token (max_tokens, or a stop
// token) when its worker failed ends with that reason, not a migration.
// Callbacks run on gRPC's threads; `mu_` orders them. No thread per
// request.

#ifndef TRIDENT_SERVICES_ROUTER_FLIGHT_H_
#define TRIDENT_SERVICES_ROUTER_FLIGHT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "common/engine/token_source.h"
#include "services/router/admission/admission_controller.h"
#include "services/router/router_metrics.h"
#include "services/router/routing_options.h"
#include "services/router/worker_streams.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident::router {

class Flight;

// What a flight needs of the source that runs it.
class FlightOwner {
 public:
  // The chosen decode worker's KV cache was full: wait for room (admitted
  // again later), or end the request when its wait is over.
  virtual void WaitForKv(const std::shared_ptr<Flight>& flight, const absl::Status& why) = 0;
  // A worker failed under the request and its calls have ended: route it
  // again (Flight::AdmissionAsk names the failed workers to avoid).
  virtual void Migrate(const std::shared_ptr<Flight>& flight) = 0;
  // The request ended and its last event was delivered.
  virtual void OnFlightDone(const Flight& flight) = 0;

 protected:
  ~FlightOwner() = default;
};

// Where a request runs, as admission chose it.
struct FlightRoute {
  admission::AdmissionId admission = 0;
  std::string prefill_id;
  std::string decode_id;
  // One worker without a KV transport serves both halves (admission's
  // AdmissionDecision::colocated).
  bool colocated = false;
  std::string prefill_address;
  std::string decode_address;
  WorkerStubs* prefill_stubs = nullptr;
  WorkerStubs* decode_stubs = nullptr;
  absl::Duration predicted_ttft;
  absl::Duration predicted_tpot;
};

// Thread-safe. Owned by shared pointers: the source's table until it ends,
// and the callbacks in flight.
class Flight final : public std::enable_shared_from_this<Flight>, private StreamEvents {
 public:
  // `owner`, `admission` and `options` must outlive the flight.
  Flight(FlightOwner* owner, admission::AdmissionController* admission,
         const RemoteTokenSourceOptions* options, const Clock* clock,
         engine::EngineRequest request, engine::TokenCallback callback, absl::Time arrival);
  ~Flight();

  const engine::EngineRequest& request() const { return request_; }
  absl::Time arrival() const { return arrival_; }

  // What admission is asked: the prompt plus the tokens streamed so far;
  // after a failure, must_admit and the workers that failed unreachable or
  // stalled excluded (one that answered ABORTED may take the retry).
  admission::AdmissionRequest AdmissionAsk() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether this is a migration's routing (a worker failed under it).
  bool migrating() const ABSL_LOCKS_EXCLUDED(mu_);
  // The failure that set the last migration off (OK before any).
  absl::Status migration_cause() const ABSL_LOCKS_EXCLUDED(mu_);
  // The latest a request that finds the KV cache full may still be given
  // room: its TTFT target under admission, its deadline, max_kv_wait after
  // its arrival; for a migration, migration_wait after it.
  absl::Time WaitLimit(const admission::AdmissionDecision& decision) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Takes the route and asks its decode worker for a reservation (or, when
  // the route is colocated, starts the worker's Decode call without one);
  // ends the request instead if it was aborted meanwhile.
  void Reserve(FlightRoute route) ABSL_LOCKS_EXCLUDED(mu_);
  // While the request waits for KV room.
  void SetWaiting(bool waiting) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a request that has no call in flight: its final event carries
  // `status` (kError), or kAborted when it is OK; `rejected`: counted as
  // refused for that reason. A migration that found no worker passes
  // `migration` (counted in the migration metrics).
  void EndWithoutCalls(const absl::Status& status,
                       absl::optional<admission::RejectReason> rejected,
                       absl::optional<MigrationOutcome> migration = absl::nullopt)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels the calls in flight; the request then ends as aborted.
  void Abort() ABSL_LOCKS_EXCLUDED(mu_);
  bool aborted() const ABSL_LOCKS_EXCLUDED(mu_);
  // The decode worker this attempt is watching and when the attempt last saw
  // it make progress (a token, or the KV handed over); nullopt while there
  // is nothing to watch.
  struct Progress {
    std::string decode_id;
    absl::Time at;
  };
  absl::optional<Progress> WatchedProgress() const ABSL_LOCKS_EXCLUDED(mu_);
  // The watchdog: if neither this decode stream nor any other on the same
  // worker has brought a token for stall_timeout (`worker_progress`: the
  // latest WatchedProgress of each decode worker, over every flight), ends
  // the attempt as stalled; the request migrates. Returns whether it did. A
  // request queued behind others on a busy worker is not stalled: the
  // worker makes progress, only not on it.
  bool CheckProgress(absl::Time now,
                     const absl::flat_hash_map<std::string, absl::Time>& worker_progress)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Waiting state, guarded by the owner's lock.
  absl::Time wait_limit = absl::InfiniteFuture();
  absl::Time next_try = absl::InfiniteFuture();
  absl::Duration retry_interval;

 private:
  // One try on a (prefill, decode) pair. Retired attempts are kept until
  // the flight ends (their calls' contexts stay valid).
  struct Attempt {
    FlightRoute route;
    absl::Time admitted_at;
    absl::Time reserved_at;
    trident::v1::ReserveKvRequest reserve_request;
    trident::v1::ReserveKvResponse reserve_response;
    std::unique_ptr<grpc::ClientContext> reserve_context;
    // The reservation granted, if any (released explicitly when the
    // attempt fails: its Decode call may never have reached the worker).
    absl::optional<trident::v1::KvDestination> reserved;
    std::unique_ptr<PrefillStream> prefill;
    std::unique_ptr<DecodeStream> decode;
    int open_calls = 0;
    // The prefill's first token was emitted; decode messages wait for it.
    bool first_emitted = false;
    std::deque<trident::v1::DecodeResponse> held_decode;
    // The decode stream's completion, held until the prefill stream ended.
    absl::optional<trident::v1::GenerateComplete> held_complete;
    bool prefill_done = false;
    // The first failure of a call (the one the client gets unless the
    // request migrates), and the worker that failed.
    absl::Status failure;
    std::string failed_worker;
    bool stalled = false;
    // The watchdog watches from the moment the decode worker owes tokens
    // (the KV arrived, or the prefill stream ended), from the last sign of
    // progress.
    bool watching = false;
    absl::Time last_progress = absl::InfiniteFuture();
  };

  // StreamEvents.
  void OnPrefillMessage(const trident::v1::PrefillResponse& p) override ABSL_LOCKS_EXCLUDED(mu_);
  void OnDecodeMessage(trident::v1::DecodeResponse d) override ABSL_LOCKS_EXCLUDED(mu_);
  void OnCallDone(Call call, const grpc::Status& status) override ABSL_LOCKS_EXCLUDED(mu_);

  // The reservation's answer: the streams start, or the request waits for
  // KV room (returns false: the caller hands it to WaitForKv), or ends.
  bool OnReserved(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  void StartStreams(const trident::v1::KvDestination& destination) ABSL_LOCKS_EXCLUDED(mu_);
  void HandlePrefillLocked(const trident::v1::PrefillResponse& p)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleDecodeLocked(const trident::v1::DecodeResponse& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the attempt's first failure and queues the cancellation of its
  // calls (cancels_, run without mu_).
  void FailLocked(const absl::Status& status, const std::string& worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Both calls have ended: completes, migrates (returns true: the caller
  // hands the flight to the owner's Migrate) or fails the request.
  bool ConcludeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The request streamed its last token already: the reason it ended
  // with, if so.
  absl::optional<engine::FinishReason> EndedByItsTokensLocked() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Emits the tokens of `chunk`.
  void EmitChunkLocked(const trident::v1::TokenChunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Emits the final event from a worker's completion.
  void EmitCompleteLocked(const trident::v1::GenerateComplete& complete)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `ev` for the callback, which DeliverOutbox calls in order
  // without holding mu_ (the callback may call Abort, e.g. on a stop
  // string).
  void EmitLocked(engine::TokenEvent ev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Delivers queued events (one thread at a time, in order); once the
  // request is settled and its last event delivered, tells the owner.
  void DeliverOutbox() ABSL_LOCKS_EXCLUDED(mu_);
  // The final event of a request that did not complete: aborted, or failed
  // with `status`.
  void EndLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  engine::RequestPlacement PlacementLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives the attempt's admission slot back (observing its TPOT).
  void ReleaseAdmissionLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Admission's bookkeeping and the debug line, once the request is over.
  void SettleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a migration's outcome.
  void CountMigrationLocked(MigrationOutcome outcome, bool stalled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The attempt in progress, else the last one; null before any.
  const Attempt* LatestLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  FlightOwner* const owner_;
  admission::AdmissionController* const admission_;
  const RemoteTokenSourceOptions* const options_;
  const Clock* const clock_;
  const engine::EngineRequest request_;
  const engine::TokenCallback callback_;
  const absl::Time arrival_;

  mutable absl::Mutex mu_;
  // From admission on (a request refused at the door is counted by the
  // admission's decision alone); null before.
  std::unique_ptr<RequestObserver> observer_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Attempt> attempt_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Attempt>> retired_ ABSL_GUARDED_BY(mu_);
  // The resume record: every token streamed to the client, in order.
  std::vector<int32_t> streamed_ ABSL_GUARDED_BY(mu_);
  int migrations_ ABSL_GUARDED_BY(mu_) = 0;
  // The last migration: when, why, whether the watchdog set it off, and
  // whether it found its new pair (it counts as resumed then).
  struct Migration {
    absl::Time at;
    absl::Status cause;
    bool stalled = false;
    bool routed = false;
  };
  absl::optional<Migration> last_migration_ ABSL_GUARDED_BY(mu_);
  // Cancellations FailLocked queued, run by the entry points without mu_.
  std::vector<std::function<void()>> cancels_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> failed_workers_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  // The final event was emitted.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<engine::TokenEvent> outbox_ ABSL_GUARDED_BY(mu_);
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;
  // SettleLocked ran; the owner was told (OnFlightDone).
  bool settled_ ABSL_GUARDED_BY(mu_) = false;
  bool reported_done_ ABSL_GUARDED_BY(mu_) = false;
  // Milestones, on the source's clock, and the workers' own timings.
  absl::Time first_token_at_ ABSL_GUARDED_BY(mu_);
  absl::Time last_token_at_ ABSL_GUARDED_BY(mu_);
  absl::Time transfer_done_at_ ABSL_GUARDED_BY(mu_);
  absl::optional<absl::Duration> prefill_queued_ ABSL_GUARDED_BY(mu_);
  // Prompt tokens the prefill worker found cached (its first token's
  // message).
  int32_t prefill_cached_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t prefill_dram_cached_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  absl::optional<absl::Duration> prefill_time_ ABSL_GUARDED_BY(mu_);
  absl::optional<absl::Duration> transfer_time_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::router

#endif  // TRIDENT_SERVICES_ROUTER_FLIGHT_H_
