// The router's TokenSource: a request's tokens from a (decode, prefill)
// worker pair that SLO admission chose (each request a Flight, flight.h).
//
//   Submit ─ Admit ──rejected──▶ RESOURCE_EXHAUSTED + RetryInfo (at once)
//              │admitted
//              ▼
//          Flight: ReserveKv, then the Prefill and Decode streams
//              │ RESOURCE_EXHAUSTED (KV cache full)
//              ▼
//          WAITING FOR KV ROOM ── retried when a request of this router
//              │  ends, and every `kv_retry_interval`, admission choosing
//              │  the pair again (another decode worker may have room); at
//              │  the request's TTFT target (admission on) or deadline:
//              └────▶ RESOURCE_EXHAUSTED + RetryInfo
//
// MIGRATION: when a worker fails under a request (its stream breaks, it is
// unreachable or stopped, it answers UNAVAILABLE or ABORTED, or its decode
// stream stalls past `stall_timeout`), the request is admitted again
// (whatever the SLO predictions; never on a worker that was unreachable or
// stalled) with its prompt plus the tokens already streamed, and the client's
// stream continues: no token lost or repeated, seeded draws continuing as
// they would have. At most `migration_limit` times per request; with no
// worker left it ends UNAVAILABLE.
//
// A worker call that fails otherwise ends the request with that worker's
// status, code and details (e.g. RESOURCE_EXHAUSTED with RetryInfo, or
// INVALID_ARGUMENT with BadRequest), its message prefixed with the call and
// the worker's address. Abort (client cancellation) cancels the calls in
// flight (the workers then end the sequence and free its KV) or ends a
// wait at once.
//
// No thread is started per request: gRPC's callback pool, plus one timer
// thread of this class (KV waits and the stall watchdog).

#ifndef TRIDENT_SERVICES_ROUTER_REMOTE_TOKEN_SOURCE_H_
#define TRIDENT_SERVICES_ROUTER_REMOTE_TOKEN_SOURCE_H_

#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/engine/token_source.h"
#include "common/time/clock.h"
#include "services/router/admission/admission_controller.h"
#include "services/router/flight.h"
#include "services/router/routing_options.h"
#include "services/router/worker_streams.h"

namespace trident::router {

// Thread-safe.
class RemoteTokenSource final : public engine::TokenSource, private FlightOwner {
 public:
  // `admission` must outlive this.
  RemoteTokenSource(admission::AdmissionController* admission, RemoteTokenSourceOptions options);
  // Aborts the requests in flight and waits until every call has ended.
  ~RemoteTokenSource() override;

  // Where a worker (by the id its load reports carry) is reached.
  void SetWorkerAddress(const std::string& worker_id, const std::string& address);

  // Errors (the callback is then never called): admission's
  // RESOURCE_EXHAUSTED with RetryInfo, its INVALID_ARGUMENT for a request
  // it cannot judge, UNAVAILABLE when the chosen worker has no known
  // address or the source is shutting down, ALREADY_EXISTS for an id in
  // flight.
  absl::Status Submit(engine::EngineRequest request, engine::TokenCallback callback) override;
  void Abort(const std::string& request_id) override;

  // Requests waiting for KV room now (the `trident_router_requests_waiting_kv`
  // gauge).
  int num_waiting_kv() const ABSL_LOCKS_EXCLUDED(mu_);
  // Requests in flight (admitted and not yet ended).
  int num_in_flight() const ABSL_LOCKS_EXCLUDED(mu_);

  // Retries the waiting requests that are due on the clock and ends those
  // past their limit, as the timer thread does.
  void RunTimersForTesting() ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until no request is in flight (each one's calls have ended and
  // its admission slot is released).
  void AwaitIdleForTesting() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until `n` requests wait for KV room.
  void AwaitWaitingKvForTesting(int n) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class RouteKind { kFirst, kKvRetry, kMigration };

  // Admits `flight` (again, after a wait or a failure) and reserves KV on
  // the chosen decode worker: OK when the reservation is under way, else
  // the status the request ends with. On a KV retry, `no_room` says
  // admission still finds no KV room (the request keeps waiting).
  absl::Status Route(const std::shared_ptr<Flight>& flight, RouteKind kind, bool* no_room)
      ABSL_LOCKS_EXCLUDED(mu_);
  // FlightOwner.
  void WaitForKv(const std::shared_ptr<Flight>& flight, const absl::Status& why) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void Migrate(const std::shared_ptr<Flight>& flight) override ABSL_LOCKS_EXCLUDED(mu_);
  // A request ended: wakes the waiting ones (its KV is free again) and
  // forgets it.
  void OnFlightDone(const Flight& flight) override ABSL_LOCKS_EXCLUDED(mu_);
  void RunTimers() ABSL_LOCKS_EXCLUDED(mu_);
  void TimerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Stubs for the worker at `address` (created once).
  WorkerStubs* StubsFor(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  admission::AdmissionController* const admission_;
  const RemoteTokenSourceOptions options_;
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Set to make the timer thread look at the waiting requests now.
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::string> addresses_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<WorkerStubs>> stubs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Flight>> flights_ ABSL_GUARDED_BY(mu_);
  // Requests waiting for KV room, oldest first.
  std::deque<std::shared_ptr<Flight>> waiting_ ABSL_GUARDED_BY(mu_);
  std::thread timer_thread_;
};

}  // namespace trident::router

#endif  // TRIDENT_SERVICES_ROUTER_REMOTE_TOKEN_SOURCE_H_
