#include "services/controller/balancer/role_balancer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/time/proto_time.h"

namespace trident::controller {
namespace {

namespace v1 = ::trident::v1;

void FillPressure(const RolePressure& from, v1::RolePressure* to) {
  to->set_observed(from.observed);
  to->set_forecast(from.forecast);
  to->set_dominant(from.dominant);
  to->set_workers(from.workers);
}

v1::RoleDecision DecisionToProto(const Decision& decision) {
  v1::RoleDecision out;
  SetProtoTimestamp(decision.time, out.mutable_time());
  out.set_flip(decision.action == Decision::Action::kFlip);
  out.set_reason(std::string(DecisionReasonName(decision.reason)));
  out.set_worker_id(decision.worker_id);
  out.set_from_role(decision.from);
  out.set_to_role(decision.to);
  out.set_detail(decision.detail);
  FillPressure(decision.prefill, out.mutable_prefill());
  FillPressure(decision.decode, out.mutable_decode());
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RoleBalancer>> RoleBalancer::Create(
    RoleBalancerOptions options, Membership* membership, MetricsSource* source,
    RoleSetter* setter, ControllerMetrics* metrics, const Clock* clock) {
  absl::StatusOr<RolePolicy> policy = RolePolicy::Create(options.policy, clock);
  if (!policy.ok()) return policy.status();
  if (options.drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("drain_timeout must not be negative");
  }
  return std::unique_ptr<RoleBalancer>(new RoleBalancer(
      std::move(options), std::move(*policy), membership, source, setter, metrics, clock));
}

RoleBalancer::RoleBalancer(RoleBalancerOptions options, RolePolicy policy,
                           Membership* membership, MetricsSource* source, RoleSetter* setter,
                           ControllerMetrics* metrics, const Clock* clock)
    : options_(std::move(options)),
      membership_(membership),
      source_(source),
      setter_(setter),
      metrics_(metrics),
      clock_(clock),
      policy_(std::move(policy)) {}

RoleBalancer::~RoleBalancer() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](bool* in_flight) { return !*in_flight; }, &call_in_flight_));
}

bool RoleBalancer::FlipPending() const {
  if (call_in_flight_) return true;
  if (flipping_worker_.empty()) return false;
  const v1::Topology topology = membership_->Snapshot();
  for (const v1::WorkerEntry& w : topology.workers()) {
    if (w.registration().worker_id() != flipping_worker_) continue;
    return w.state() != v1::SERVING_STATE_DEAD && w.pending_role() != v1::ROLE_UNSPECIFIED;
  }
  return false;
}

Decision RoleBalancer::RunInterval() {
  Observation observation;
  observation.workers = membership_->PolicyWorkers();
  {
    absl::MutexLock lock(&mu_);
    observation.flip_pending = FlipPending();
    if (!observation.flip_pending) flipping_worker_.clear();
  }
  if (source_ == nullptr) {
    observation.signals =
        absl::UnavailableError("no metrics source: the controller runs without --prometheus_url");
  } else if (!observation.flip_pending) {
    observation.signals = ReadClusterSignals(*source_, observation.workers, options_.queries);
  }
  Decision decision = policy_.Decide(observation);
  if (metrics_ != nullptr) {
    metrics_->RecordDecision(decision);
    metrics_->SetFlipPending(observation.flip_pending ||
                             decision.action == Decision::Action::kFlip);
  }
  {
    absl::MutexLock lock(&mu_);
    const bool repeat = logged_any_ && decision.reason == last_reason_;
    if (decision.action == Decision::Action::kFlip || !repeat) {
      TRIDENT_LOG(INFO) << "role decision: " << DecisionToString(decision);
    } else {
      TRIDENT_LOG(DEBUG) << "role decision: " << DecisionToString(decision);
    }
    last_reason_ = decision.reason;
    logged_any_ = true;
    Keep(decision);
  }
  if (decision.action == Decision::Action::kFlip) StartFlip(decision);
  return decision;
}

void RoleBalancer::StartFlip(const Decision& decision) {
  absl::StatusOr<std::string> address = membership_->WorkerAddress(decision.worker_id);
  if (!address.ok()) {
    TRIDENT_LOG(WARNING) << "flip of " << decision.worker_id << " not made: " << address.status();
    if (metrics_ != nullptr) metrics_->RecordFlipFailure();
    return;
  }
  v1::SetRoleRequest request;
  request.set_role(decision.to);
  SetProtoDuration(options_.drain_timeout, request.mutable_drain_timeout());
  request.set_reason(std::string(DecisionReasonName(decision.reason)));
  {
    absl::MutexLock lock(&mu_);
    request.set_directive_id(next_directive_id_++);
    flipping_worker_ = decision.worker_id;
    call_in_flight_ = true;
  }
  (void)membership_->SetOrderedRole(decision.worker_id, decision.to);
  setter_->SetRole(*address, request,
                   [this, decision](absl::StatusOr<v1::SetRoleResponse> result) {
                     FinishFlip(decision, result);
                   });
}

void RoleBalancer::FinishFlip(const Decision& decision,
                              const absl::StatusOr<v1::SetRoleResponse>& result) {
  if (result.ok()) {
    TRIDENT_LOG(INFO) << "flip of " << decision.worker_id << " " << RoleName(decision.from)
                      << "->" << RoleName(result->role()) << " done: drained "
                      << result->drained_sequences() << ", aborted "
                      << result->aborted_sequences() << " in "
                      << absl::FormatDuration(DurationFromProto(result->drain_time()));
    if (metrics_ != nullptr) metrics_->RecordFlip(result->previous_role(), result->role());
  } else {
    TRIDENT_LOG(WARNING) << "flip of " << decision.worker_id << " to " << RoleName(decision.to)
                         << " failed; it keeps its role: " << result.status();
    (void)membership_->SetOrderedRole(decision.worker_id, v1::ROLE_UNSPECIFIED);
    if (metrics_ != nullptr) metrics_->RecordFlipFailure();
  }
  absl::MutexLock lock(&mu_);
  if (result.ok()) ++flips_;
  call_in_flight_ = false;
}

void RoleBalancer::Keep(const Decision& decision) {
  decisions_.push_front(decision);
  while (static_cast<int32_t>(decisions_.size()) > std::max(1, options_.decisions_kept)) {
    decisions_.pop_back();
  }
}

v1::ControllerStatus RoleBalancer::Status(int32_t max_decisions) const {
  if (max_decisions <= 0) max_decisions = 10;
  v1::ControllerStatus status;
  status.set_controller_incarnation(membership_->options().controller_incarnation);
  status.set_prometheus_url(options_.prometheus_url);
  SetProtoDuration(policy_.options().interval, status.mutable_decision_interval());
  absl::MutexLock lock(&mu_);
  status.set_pending_flip_worker_id(flipping_worker_);
  status.set_flips_total(flips_);
  for (const Decision& decision : decisions_) {
    if (status.decisions_size() >= max_decisions) break;
    *status.add_decisions() = DecisionToProto(decision);
  }
  return status;
}

int64_t RoleBalancer::flips() const {
  absl::MutexLock lock(&mu_);
  return flips_;
}

}  // namespace trident::controller
