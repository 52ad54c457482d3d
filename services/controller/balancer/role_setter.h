#ifndef TRIDENT_SERVICES_CONTROLLER_BALANCER_ROLE_SETTER_H_
#define TRIDENT_SERVICES_CONTROLLER_BALANCER_ROLE_SETTER_H_

// How the controller switches a worker's role: WorkerControl.SetRole on the
// worker's address, asynchronously (the call returns once the worker has
// drained and switched, which can take the whole drain timeout).

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident::controller {

class RoleSetter {
 public:
  using Done = std::function<void(absl::StatusOr<trident::v1::SetRoleResponse>)>;
  virtual ~RoleSetter() = default;

  // Starts the switch; `done` runs once with the outcome, on any thread.
  virtual void SetRole(const std::string& address, const trident::v1::SetRoleRequest& request,
                       Done done) = 0;
};

// Thread-safe. One channel per worker address, kept.
class GrpcRoleSetter final : public RoleSetter {
 public:
  // Each call's deadline is the request's drain timeout plus `margin`.
  explicit GrpcRoleSetter(absl::Duration margin = absl::Seconds(30)) : margin_(margin) {}
  // Waits for the calls in flight to end.
  ~GrpcRoleSetter() override;

  void SetRole(const std::string& address, const trident::v1::SetRoleRequest& request,
               Done done) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Call;
  trident::v1::WorkerControl::Stub* StubFor(const std::string& address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration margin_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<trident::v1::WorkerControl::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_BALANCER_ROLE_SETTER_H_
