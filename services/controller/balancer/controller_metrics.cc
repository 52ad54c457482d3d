#include "services/controller/balancer/controller_metrics.h"

#include <array>
#include <map>
#include <string>
#include <utility>

namespace trident::controller {
namespace {

namespace v1 = ::trident::v1;

constexpr std::array<DecisionReason, 14> kAllReasons = {
    DecisionReason::kPrefillPressure, DecisionReason::kDecodePressure,
    DecisionReason::kFlipPending,     DecisionReason::kMetricsUnavailable,
    DecisionReason::kSeriesMissing,   DecisionReason::kMetricsError,
    DecisionReason::kOnePerInterval,  DecisionReason::kNoWorkers,
    DecisionReason::kWarmingUp,       DecisionReason::kBalanced,
    DecisionReason::kLastWorker,      DecisionReason::kNoHeadroom,
    DecisionReason::kSustaining,      DecisionReason::kDwell,
};

bool IsFlipReason(DecisionReason reason) {
  return reason == DecisionReason::kPrefillPressure || reason == DecisionReason::kDecodePressure;
}

std::string StateName(v1::ServingState state) {
  switch (state) {
    case v1::SERVING_STATE_SERVING:
      return "serving";
    case v1::SERVING_STATE_DRAINING:
      return "draining";
    case v1::SERVING_STATE_DEAD:
      return "dead";
    default:
      return "unspecified";
  }
}

}  // namespace

ControllerMetrics::ControllerMetrics(prometheus::Registry& registry)
    : decisions_(prometheus::BuildCounter()
                     .Name("trident_controller_decision_total")
                     .Help("Role-policy decisions, one per interval: action flip or hold, and "
                           "the reason.")
                     .Register(registry)),
      flips_(prometheus::BuildCounter()
                 .Name("trident_controller_role_flips_total")
                 .Help("Workers switched between prefill and decode (SetRole answered OK).")
                 .Register(registry)),
      flip_failures_(prometheus::BuildCounter()
                         .Name("trident_controller_flip_failures_total")
                         .Help("Flips ordered whose SetRole failed; the worker kept its role.")
                         .Register(registry)
                         .Add({})),
      pressure_(prometheus::BuildGauge()
                    .Name("trident_controller_pressure")
                    .Help("Each role's pressure (1.0 reads as its SLO or capacity): the last "
                          "interval's (kind=observed) and the forecast acted on.")
                    .Register(registry)),
      flip_pending_(prometheus::BuildGauge()
                        .Name("trident_controller_flip_pending")
                        .Help("1 while an ordered flip has not taken effect.")
                        .Register(registry)
                        .Add({})),
      members_(prometheus::BuildGauge()
                   .Name("trident_controller_members")
                   .Help("Registered members by kind, role and state.")
                   .Register(registry)) {
  for (DecisionReason reason : kAllReasons) {
    decisions_.Add({{"action", IsFlipReason(reason) ? "flip" : "hold"},
                    {"reason", std::string(DecisionReasonName(reason))}});
  }
  flips_.Add({{"from", "prefill"}, {"to", "decode"}});
  flips_.Add({{"from", "decode"}, {"to", "prefill"}});
  for (const char* role : {"prefill", "decode"}) {
    for (const char* kind : {"observed", "forecast"}) {
      pressure_.Add({{"role", role}, {"kind", kind}}).Set(kNoSignal);
    }
  }
  UpdateMembers(v1::Topology());
}

void ControllerMetrics::RecordDecision(const Decision& decision) {
  decisions_
      .Add({{"action", decision.action == Decision::Action::kFlip ? "flip" : "hold"},
            {"reason", std::string(DecisionReasonName(decision.reason))}})
      .Increment();
  pressure_.Add({{"role", "prefill"}, {"kind", "observed"}}).Set(decision.prefill.observed);
  pressure_.Add({{"role", "prefill"}, {"kind", "forecast"}}).Set(decision.prefill.forecast);
  pressure_.Add({{"role", "decode"}, {"kind", "observed"}}).Set(decision.decode.observed);
  pressure_.Add({{"role", "decode"}, {"kind", "forecast"}}).Set(decision.decode.forecast);
}

void ControllerMetrics::RecordFlip(v1::Role from, v1::Role to) {
  flips_.Add({{"from", std::string(RoleName(from))}, {"to", std::string(RoleName(to))}})
      .Increment();
}

void ControllerMetrics::RecordFlipFailure() { flip_failures_.Increment(); }

void ControllerMetrics::SetFlipPending(bool pending) { flip_pending_.Set(pending ? 1 : 0); }

void ControllerMetrics::UpdateMembers(const v1::Topology& topology) {
  std::map<std::pair<std::string, std::string>, int> workers;
  for (const char* role : {"prefill", "decode", "both"}) {
    for (const char* state : {"serving", "draining", "dead"}) workers[{role, state}] = 0;
  }
  std::map<std::string, int> attention = {{"serving", 0}, {"draining", 0}, {"dead", 0}};
  for (const v1::WorkerEntry& w : topology.workers()) {
    ++workers[{std::string(RoleName(w.role())), StateName(w.state())}];
  }
  for (const v1::AttentionServiceEntry& a : topology.attention_services()) {
    ++attention[StateName(a.state())];
  }
  for (const auto& [key, count] : workers) {
    members_.Add({{"kind", "worker"}, {"role", key.first}, {"state", key.second}}).Set(count);
  }
  for (const auto& [state, count] : attention) {
    members_.Add({{"kind", "attention"}, {"role", ""}, {"state", state}}).Set(count);
  }
}

}  // namespace trident::controller
