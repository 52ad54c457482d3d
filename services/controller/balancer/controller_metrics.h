#ifndef TRIDENT_SERVICES_CONTROLLER_BALANCER_CONTROLLER_METRICS_H_
#define TRIDENT_SERVICES_CONTROLLER_BALANCER_CONTROLLER_METRICS_H_

// The controller's metrics (README, "Metrics"):
//
//   trident_controller_decision_total{action,reason}  counter: one per policy
//       interval; action "flip" (reasons prefill_pressure, decode_pressure)
//       or "hold" (the policy's guards); every pair starts at 0
//   trident_controller_role_flips_total{from,to}      counter: flips that took
//       effect (WorkerControl.SetRole answered OK); prefill/decode pairs
//   trident_controller_flip_failures_total            counter: flips whose
//       SetRole failed (the worker kept its role)
//   trident_controller_pressure{role,kind}            gauge: each role's
//       pressure, kind "observed" or "forecast"; NaN when unknown
//   trident_controller_flip_pending                   gauge: 1 while a flip
//       is under way
//   trident_controller_members{kind,role,state}       gauge: registered
//       members; kind worker (role prefill/decode/both) or attention (role
//       ""), state serving/draining/dead

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "services/controller/policy/role_policy.h"
#include "trident/v1/controller.pb.h"

namespace trident::controller {

// Thread-safe (prometheus-cpp metrics are).
class ControllerMetrics {
 public:
  explicit ControllerMetrics(prometheus::Registry& registry);

  // Counts the decision and sets the pressure gauges from it.
  void RecordDecision(const Decision& decision);
  void RecordFlip(trident::v1::Role from, trident::v1::Role to);
  void RecordFlipFailure();
  void SetFlipPending(bool pending);
  // Sets every members gauge from the topology (zeros included).
  void UpdateMembers(const trident::v1::Topology& topology);

 private:
  prometheus::Family<prometheus::Counter>& decisions_;
  prometheus::Family<prometheus::Counter>& flips_;
  prometheus::Counter& flip_failures_;
  prometheus::Family<prometheus::Gauge>& pressure_;
  prometheus::Gauge& flip_pending_;
  prometheus::Family<prometheus::Gauge>& members_;
};

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_BALANCER_CONTROLLER_METRICS_H_
