#ifndef TRIDENT_SERVICES_CONTROLLER_CONTROLLER_SERVER_H_
#define TRIDENT_SERVICES_CONTROLLER_CONTROLLER_SERVER_H_

// The controller process's parts, wired together: the membership, the
// Prometheus client (when a URL is given), the role balancer with its
// WorkerControl.SetRole client, the metrics, the gRPC service, and one loop
// thread that marks silent members DEAD every heartbeat interval and runs
// the role policy every decision interval. main.cc fills the options from
// flags; tests serve services() on port 0.

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/grpc/server.h"
#include "common/time/clock.h"
#include "prometheus/registry.h"
#include "services/controller/balancer/controller_metrics.h"
#include "services/controller/balancer/role_balancer.h"
#include "services/controller/balancer/role_setter.h"
#include "services/controller/controller_service.h"
#include "services/controller/membership/membership.h"
#include "services/controller/prometheus/metrics_source.h"

namespace trident::controller {

struct ControllerServerOptions {
  // controller_incarnation 0: a random nonzero one.
  MembershipOptions membership;
  // balancer.prometheus_url empty: no role decisions (every interval holds
  // with metrics_unavailable). balancer.policy.interval is the decision
  // interval.
  RoleBalancerOptions balancer;
  // Longest wait for one Prometheus answer.
  absl::Duration prometheus_timeout = absl::Seconds(5);
};

class ControllerServer {
 public:
  // kInvalidArgument for bad options (named). `registry` and `clock` must
  // outlive the server; the loop waits in real time, the decisions read
  // `clock`.
  static absl::StatusOr<std::unique_ptr<ControllerServer>> Create(ControllerServerOptions options,
                                                                  prometheus::Registry& registry,
                                                                  const Clock* clock);
  // Stops the loop thread.
  ~ControllerServer();

  std::vector<RegisteredService> services();
  Membership& membership() { return *membership_; }
  RoleBalancer& balancer() { return *balancer_; }
  uint64_t incarnation() const { return membership_->options().controller_incarnation; }

 private:
  ControllerServer() = default;
  void Loop();

  absl::Duration decision_interval_;
  std::unique_ptr<Membership> membership_;
  std::unique_ptr<MetricsSource> source_;
  std::unique_ptr<ControllerMetrics> metrics_;
  std::unique_ptr<GrpcRoleSetter> setter_;
  std::unique_ptr<RoleBalancer> balancer_;
  std::unique_ptr<ControllerService> service_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread loop_;
};

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_CONTROLLER_SERVER_H_
