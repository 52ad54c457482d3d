// The router's TokenSource: a request's tokens from a (decode, prefill)
// worker pair that SLO admission chose. Per request, on its own thread:
// Decode.ReserveKv on the decode worker, Prefill with that destination on
// the prefill worker (its first token is output 0), Decode on the
// reservation (outputs 1, 2, ...). A request admission refuses fails at
// Submit with RESOURCE_EXHAUSTED and RetryInfo, before any worker is called.
// Abort (client cancellation) cancels both worker calls, which end the
// sequence and free its KV on both workers.

#ifndef TRIDENT_SERVICES_ROUTER_REMOTE_TOKEN_SOURCE_H_
#define TRIDENT_SERVICES_ROUTER_REMOTE_TOKEN_SOURCE_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/token_source.h"
#include "common/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "services/router/admission/admission_controller.h"
#include "services/router/router_metrics.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident::router {

struct RemoteTokenSourceOptions {
  // Lease asked for each KV reservation.
  absl::Duration reserve_lease = absl::Seconds(30);
  // Deadline of each worker call (the whole prefill, the whole decode).
  absl::Duration call_timeout = absl::Minutes(10);
  // Where request outcomes, admission decisions and latencies are recorded
  // (router_metrics.h); null: nowhere. Must outlive the source.
  RouterMetrics* metrics = nullptr;
  // The clock latencies are measured on; null: the real clock.
  const Clock* clock = nullptr;
};

// Thread-safe.
class RemoteTokenSource final : public engine::TokenSource {
 public:
  // `admission` must outlive this.
  RemoteTokenSource(admission::AdmissionController* admission, RemoteTokenSourceOptions options);
  // Aborts the requests in flight and waits for their threads.
  ~RemoteTokenSource() override;

  // Where a worker (by the id its load reports carry) is reached.
  void SetWorkerAddress(const std::string& worker_id, const std::string& address);

  absl::Status Submit(engine::EngineRequest request, engine::TokenCallback callback) override;
  void Abort(const std::string& request_id) override;

 private:
  struct Flight;
  void Run(std::shared_ptr<Flight> flight);
  struct Stubs {
    std::unique_ptr<trident::v1::Prefill::Stub> prefill;
    std::unique_ptr<trident::v1::Decode::Stub> decode;
  };
  // Stubs for the worker at `address` (created once).
  Stubs* StubsFor(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  admission::AdmissionController* const admission_;
  const RemoteTokenSourceOptions options_;
  const Clock* const clock_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, std::string> addresses_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::unique_ptr<Stubs>> stubs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Flight>> flights_ ABSL_GUARDED_BY(mu_);
  int running_threads_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trident::router

#endif  // TRIDENT_SERVICES_ROUTER_REMOTE_TOKEN_SOURCE_H_
