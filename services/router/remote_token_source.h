// The router's TokenSource: a request's tokens from a (decode, prefill)
// worker pair that SLO admission chose.
//
// Each request is a small state machine driven by gRPC's callback client
// API; no thread is started per request, so the router's thread count does
// not grow with the requests in flight (gRPC's callback pool plus one timer
// thread of this class).
//
//   Submit ─ Admit ──rejected──▶ RESOURCE_EXHAUSTED + RetryInfo (at once)
//              │admitted
//              ▼
//          ReserveKv on the decode worker ──other error──▶ that status
//              │ ok                    │ RESOURCE_EXHAUSTED (KV cache full)
//              │                       ▼
//              │               WAITING FOR KV ROOM ── retried when a request
//              │                 │  of this router ends, and every
//              │                 │  `kv_retry_interval`, admission choosing
//              │                 │  the pair again (another decode worker
//              │                 │  may have room); at the request's TTFT
//              │                 │  target (admission on) or deadline:
//              │                 └────▶ RESOURCE_EXHAUSTED + RetryInfo
//              ▼
//          Decode stream (read from the start) + Prefill stream into the
//          reservation: the prefill's first token is output 0, the decode
//          stream's tokens follow.
//
// A worker call that fails ends the request with that worker's status,
// code and details (e.g. RESOURCE_EXHAUSTED with RetryInfo, or
// INVALID_ARGUMENT with BadRequest), its message prefixed with the call and
// the worker's address; a decode failure cancels the prefill call and vice
// versa, and the first failure is the one reported. Abort (client
// cancellation) cancels the calls in flight (the workers then end the
// sequence and free its KV) or ends a wait at once.

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
#include "grpcpp/grpcpp.h"
#include "services/router/admission/admission_controller.h"
#include "services/router/kv_index/kv_index.h"
#include "services/router/router_metrics.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident::router {

struct RemoteTokenSourceOptions {
  // Lease asked for each KV reservation.
  absl::Duration reserve_lease = absl::Seconds(30);
  // Whether decode workers may place a request's KV on a CPU attention
  // service (ReserveKvRequest.allow_cpu_attention): its long-context
  // requests, or any when their GPU pool is full.
  bool allow_cpu_attention = true;
  // Deadline of each worker call (the whole prefill, the whole decode).
  absl::Duration call_timeout = absl::Minutes(10);
  // Deadline of one ReserveKv call.
  absl::Duration reserve_timeout = absl::Seconds(10);
  // A request that finds the decode side's KV cache full waits for room at
  // most until its TTFT target (admission on), its deadline, or this long
  // after its arrival, whichever comes first.
  absl::Duration max_kv_wait = absl::Seconds(60);
  // How often a waiting request asks again when nothing wakes it sooner.
  absl::Duration kv_retry_interval = absl::Milliseconds(100);
  // The RetryInfo delay of a request that waited in vain.
  absl::Duration kv_full_retry_after = absl::Seconds(1);
  // Where request outcomes, admission decisions and latencies are recorded
  // (router_metrics.h); null: nowhere. Must outlive the source.
  RouterMetrics* metrics = nullptr;
  // The workers' prefix caches, for KV-aware routing (each prefill worker
  // priced for the prompt tokens it lacks); null: every prompt priced
  // whole. Must outlive the source.
  const kv_index::KvIndex* kv_index = nullptr;
  // The clock latencies and waits are measured on; null: the real clock.
  const Clock* clock = nullptr;
  // Whether a thread of the source retries and expires waiting requests on
  // its own. false: only RunTimersForTesting does (tests on a fake clock).
  bool timer_thread = true;
};

// Thread-safe.
class RemoteTokenSource final : public engine::TokenSource {
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
  // Blocks until `n` requests wait for KV room.
  void AwaitWaitingKvForTesting(int n) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Flight;
  struct Stubs {
    std::unique_ptr<trident::v1::Prefill::Stub> prefill;
    std::unique_ptr<trident::v1::Decode::Stub> decode;
  };

  // Admits `flight` (again, after a wait) and reserves KV on the chosen
  // decode worker: OK when the reservation is under way, else the status
  // the request ends with. On a retry, `no_room` says admission still
  // finds no KV room (the request keeps waiting).
  absl::Status Route(const std::shared_ptr<Flight>& flight, bool first_attempt, bool* no_room)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The KV cache was full: wait for room, or end the request if its wait is
  // over.
  void WaitForKv(const std::shared_ptr<Flight>& flight, const absl::Status& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A request ended: wakes the waiting ones (its KV is free again) and
  // forgets it.
  void OnFlightDone(const Flight& flight) ABSL_LOCKS_EXCLUDED(mu_);
  void RunTimers() ABSL_LOCKS_EXCLUDED(mu_);
  void TimerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Stubs for the worker at `address` (created once).
  Stubs* StubsFor(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  admission::AdmissionController* const admission_;
  const RemoteTokenSourceOptions options_;
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Set to make the timer thread look at the waiting requests now.
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::string> addresses_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Stubs>> stubs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Flight>> flights_ ABSL_GUARDED_BY(mu_);
  // Requests waiting for KV room, oldest first.
  std::deque<std::shared_ptr<Flight>> waiting_ ABSL_GUARDED_BY(mu_);
  std::thread timer_thread_;
};

}  // namespace trident::router

#endif  // TRIDENT_SERVICES_ROUTER_REMOTE_TOKEN_SOURCE_H_
