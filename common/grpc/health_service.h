#ifndef TRIDENT_COMMON_GRPC_HEALTH_SERVICE_H_
#define TRIDENT_COMMON_GRPC_HEALTH_SERVICE_H_

// Trident's implementation of the standard `grpc.health.v1.Health` service
// (Kubernetes gRPC probes, load balancers, `trident status`). Unlike gRPC's
// built-in one, Shutdown() ends every Watch stream (after telling it
// NOT_SERVING), so a watcher never holds a drain open until its deadline.
//
// Statuses are kept per service name; "" is the server as a whole. Check of
// an unknown name answers NOT_FOUND; Watch of one answers SERVICE_UNKNOWN and
// keeps watching, as the protocol says.

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace trident {

// Thread-safe.
class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  HealthService() = default;
  HealthService(const HealthService&) = delete;
  HealthService& operator=(const HealthService&) = delete;
  // REQUIRES: the server using this service has shut down (no Watch left).
  ~HealthService() override;

  // Sets the status of `service` ("" = the whole server) and tells its
  // watchers. Ignored after Shutdown().
  void SetStatus(const std::string& service, ServingStatus status) ABSL_LOCKS_EXCLUDED(mu_);

  // Marks every service NOT_SERVING, sends that to every watcher and then
  // ends their streams with OK. Later Watch calls get NOT_SERVING and end.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until every Watch stream has ended (after Shutdown, each is sent
  // NOT_SERVING and finished), or until `deadline`: a server that shuts
  // down before then cuts the streams off before that last message.
  void AwaitWatchersDone(absl::Time deadline) ABSL_LOCKS_EXCLUDED(open_mu_);

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

 private:
  class WatchReactor;

  // A watcher's stream is done (its OnDone).
  void WatcherDone() ABSL_LOCKS_EXCLUDED(open_mu_);
  // Deletes the watchers whose streams are done.
  void SweepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ServingStatus StatusLocked(const std::string& service) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, ServingStatus> statuses_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<WatchReactor*> watchers_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  // Watch streams not yet done; apart from mu_, which is held while
  // reactions may run inline.
  absl::Mutex open_mu_;
  int64_t open_ ABSL_GUARDED_BY(open_mu_) = 0;
};

}  // namespace trident

#endif  // TRIDENT_COMMON_GRPC_HEALTH_SERVICE_H_
