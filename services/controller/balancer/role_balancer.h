#ifndef TRIDENT_SERVICES_CONTROLLER_BALANCER_ROLE_BALANCER_H_
#define TRIDENT_SERVICES_CONTROLLER_BALANCER_ROLE_BALANCER_H_

// The controller's decision loop, one interval at a time: read the workers
// from the membership and the signals from Prometheus, ask the role policy,
// and carry out a flip through WorkerControl.SetRole. The policy
// (policy/role_policy.h) holds the rules; this holds the bookkeeping:
//
//   - a flip is pending from the order until the worker reports the new role
//     (its heartbeats), or until SetRole fails (the order is withdrawn and
//     counted); while pending, the policy holds (flip_pending), and the
//     topology shows the worker's pending role;
//   - every decision is counted (ControllerMetrics), logged (a flip, or a
//     hold whose reason differs from the last one, at INFO; repeats at DEBUG)
//     and kept (the newest `decisions_kept`) for Controller.GetStatus.
//
// Without a metrics source (no --prometheus_url) every interval holds with
// metrics_unavailable, saying so.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/time/clock.h"
#include "services/controller/balancer/controller_metrics.h"
#include "services/controller/balancer/role_setter.h"
#include "services/controller/membership/membership.h"
#include "services/controller/policy/role_policy.h"
#include "services/controller/policy/signal_reader.h"
#include "services/controller/prometheus/metrics_source.h"
#include "trident/v1/controller.pb.h"

namespace trident::controller {

struct RoleBalancerOptions {
  RolePolicyOptions policy;
  SignalQueries queries = DefaultSignalQueries();
  // How long a flipping worker lets its work in flight finish.
  absl::Duration drain_timeout = absl::Seconds(30);
  // Decisions kept for GetStatus.
  int32_t decisions_kept = 100;
  // Shown in GetStatus; empty when there is no metrics source.
  std::string prometheus_url;
};

// Thread-safe: RunInterval is called by one thread (the controller's loop);
// Status from any.
class RoleBalancer {
 public:
  // `membership`, `setter` and `clock` are not owned and must outlive the
  // balancer; `source` and `metrics` may be null. kInvalidArgument for bad
  // policy options.
  static absl::StatusOr<std::unique_ptr<RoleBalancer>> Create(RoleBalancerOptions options,
                                                              Membership* membership,
                                                              MetricsSource* source,
                                                              RoleSetter* setter,
                                                              ControllerMetrics* metrics,
                                                              const Clock* clock);
  // Waits for a SetRole in flight to end.
  ~RoleBalancer();

  // One interval: decide, count, and start a flip if the policy orders one.
  Decision RunInterval() ABSL_LOCKS_EXCLUDED(mu_);

  // Newest first, at most `max_decisions` (0: 10).
  trident::v1::ControllerStatus Status(int32_t max_decisions) const ABSL_LOCKS_EXCLUDED(mu_);

  // Flips that took effect since start.
  int64_t flips() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  RoleBalancer(RoleBalancerOptions options, RolePolicy policy, Membership* membership,
               MetricsSource* source, RoleSetter* setter, ControllerMetrics* metrics,
               const Clock* clock);

  // Whether an ordered flip is still under way (the call in flight, or the
  // worker not yet reporting its new role).
  bool FlipPending() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartFlip(const Decision& decision) ABSL_LOCKS_EXCLUDED(mu_);
  void FinishFlip(const Decision& decision,
                  const absl::StatusOr<trident::v1::SetRoleResponse>& result)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Keep(const Decision& decision) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RoleBalancerOptions options_;
  Membership* const membership_;
  MetricsSource* const source_;
  RoleSetter* const setter_;
  ControllerMetrics* const metrics_;
  const Clock* const clock_;
  // Only RunInterval's thread uses the policy.
  RolePolicy policy_;

  mutable absl::Mutex mu_;
  // The worker of the flip under way, empty if none.
  std::string flipping_worker_ ABSL_GUARDED_BY(mu_);
  bool call_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_directive_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t flips_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Decision> decisions_ ABSL_GUARDED_BY(mu_);
  DecisionReason last_reason_ ABSL_GUARDED_BY(mu_) = DecisionReason::kBalanced;
  bool logged_any_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_BALANCER_ROLE_BALANCER_H_
