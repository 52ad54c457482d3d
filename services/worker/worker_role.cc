#include "services/worker/worker_role.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/status/error_details.h"
#include "prometheus/family.h"

namespace trident::worker {
namespace {

namespace v1 = ::trident::v1;

constexpr absl::Duration kMaxDrainTimeout = absl::Hours(1);

bool IsSettable(v1::Role role) {
  return role == v1::ROLE_PREFILL || role == v1::ROLE_DECODE || role == v1::ROLE_BOTH;
}

// The `from`/`to` label values.
const char* RoleLabel(v1::Role role) {
  switch (role) {
    case v1::ROLE_PREFILL:
      return "prefill";
    case v1::ROLE_DECODE:
      return "decode";
    case v1::ROLE_BOTH:
      return "both";
    default:
      return "unspecified";
  }
}

// The capabilities `from` has and `to` lacks, for logs.
std::string LostCapabilities(v1::Role from, v1::Role to) {
  std::string out;
  for (Capability c : {Capability::kPrefill, Capability::kDecode, Capability::kColocated}) {
    if (RoleHas(from, c) && !RoleHas(to, c)) {
      absl::StrAppend(&out, out.empty() ? "" : ", ", CapabilityName(c));
    }
  }
  return out.empty() ? "nothing" : out;
}

}  // namespace

absl::string_view CapabilityName(Capability capability) {
  switch (capability) {
    case Capability::kPrefill:
      return "prefill";
    case Capability::kDecode:
      return "decode";
    case Capability::kColocated:
      return "colocated generation";
  }
  return "unknown";
}

bool RoleHas(v1::Role role, Capability capability) {
  switch (capability) {
    case Capability::kPrefill:
      return role == v1::ROLE_PREFILL || role == v1::ROLE_BOTH;
    case Capability::kDecode:
      return role == v1::ROLE_DECODE || role == v1::ROLE_BOTH;
    case Capability::kColocated:
      return role == v1::ROLE_BOTH;
  }
  return false;
}

WorkerRole::Work::Work(Work&& other) noexcept : anchor_(std::move(other.anchor_)), id_(other.id_) {
  other.anchor_ = nullptr;
  other.id_ = 0;
}

WorkerRole::Work& WorkerRole::Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    End();
    anchor_ = std::move(other.anchor_);
    id_ = other.id_;
    other.anchor_ = nullptr;
    other.id_ = 0;
  }
  return *this;
}

void WorkerRole::Work::SetAbortHook(AbortHook hook) {
  if (anchor_ == nullptr) return;
  absl::MutexLock lock(&anchor_->mu);
  if (anchor_->role != nullptr) anchor_->role->SetAbortHook(id_, std::move(hook));
}

void WorkerRole::Work::End() {
  if (anchor_ == nullptr) return;
  std::shared_ptr<Anchor> anchor = std::move(anchor_);
  anchor_ = nullptr;
  absl::MutexLock lock(&anchor->mu);
  if (anchor->role != nullptr) anchor->role->EndWork(id_);
}

WorkerRole::WorkerRole(v1::Role initial, const Clock* clock, WorkerRoleOptions options)
    : clock_(clock),
      options_(std::move(options)),
      anchor_(std::make_shared<Anchor>()),
      role_(initial) {
  {
    absl::MutexLock lock(&anchor_->mu);
    anchor_->role = this;
  }
  if (options_.registry != nullptr) {
    auto& family = prometheus::BuildCounter()
                       .Name("trident_worker_role_changes_total")
                       .Help(
                           "Role changes this worker completed (WorkerControl.SetRole), by the "
                           "role left and the role taken.")
                       .Register(*options_.registry);
    for (v1::Role from : {v1::ROLE_PREFILL, v1::ROLE_DECODE, v1::ROLE_BOTH}) {
      for (v1::Role to : {v1::ROLE_PREFILL, v1::ROLE_DECODE, v1::ROLE_BOTH}) {
        if (from == to) continue;
        changes_total_[from][to] = &family.Add({{"from", RoleLabel(from)}, {"to", RoleLabel(to)}});
      }
    }
    auto& roles = prometheus::BuildGauge()
                      .Name("trident_worker_role")
                      .Help(
                          "1 for the role this worker serves in (prefill, decode, both), 0 for "
                          "the others.")
                      .Register(*options_.registry);
    for (v1::Role role : {v1::ROLE_PREFILL, v1::ROLE_DECODE, v1::ROLE_BOTH}) {
      role_gauges_[role] = &roles.Add({{"role", RoleLabel(role)}});
    }
    SetRoleGauges(initial);
  }
}

WorkerRole::~WorkerRole() {
  absl::MutexLock lock(&anchor_->mu);
  anchor_->role = nullptr;
}

WorkerRole::State WorkerRole::state() const {
  absl::MutexLock lock(&mu_);
  return {.role = role_, .pending_role = pending_role_};
}

v1::Role WorkerRole::role() const {
  absl::MutexLock lock(&mu_);
  return role_;
}

bool WorkerRole::LosingLocked(Capability capability) const {
  return change_id_ != 0 && RoleHas(role_, capability) && !RoleHas(pending_role_, capability);
}

int32_t WorkerRole::LosingInFlightLocked() const {
  int32_t n = 0;
  for (const auto& [id, entry] : work_) {
    if (LosingLocked(entry.capability)) ++n;
  }
  return n;
}

absl::StatusOr<WorkerRole::Work> WorkerRole::Admit(Capability capability,
                                                   absl::string_view request_id, AbortHook abort) {
  absl::MutexLock lock(&mu_);
  if (!RoleHas(role_, capability)) {
    return absl::FailedPreconditionError(
        absl::StrCat("this worker's role is ", v1::Role_Name(role_), ", which does not serve ",
                     CapabilityName(capability)));
  }
  if (LosingLocked(capability) && !announcing_) {
    return absl::UnavailableError(absl::StrCat(
        "this worker is draining its ", CapabilityName(capability), " work for a role change from ",
        v1::Role_Name(role_), " to ", v1::Role_Name(pending_role_), "; try another worker"));
  }
  const uint64_t id = next_work_id_++;
  work_[id] = Entry{capability, std::string(request_id), std::move(abort)};
  // Admitted while a change announces itself: drained with the rest.
  if (announcing_ && LosingLocked(capability)) ++change_in_flight_;
  return Work(anchor_, id);
}

int32_t WorkerRole::in_flight(Capability capability) const {
  absl::MutexLock lock(&mu_);
  int32_t n = 0;
  for (const auto& [id, entry] : work_) {
    if (entry.capability == capability) ++n;
  }
  return n;
}

void WorkerRole::EndWork(uint64_t id) {
  absl::MutexLock lock(&mu_);
  work_.erase(id);
}

void WorkerRole::SetAbortHook(uint64_t id, AbortHook hook) {
  absl::MutexLock lock(&mu_);
  auto it = work_.find(id);
  if (it != work_.end()) it->second.abort = std::move(hook);
}

absl::StatusOr<WorkerRole::Started> WorkerRole::BeginChange(const RoleChange& change) {
  if (!IsSettable(change.role)) {
    return InvalidArgumentForField(
        "role", absl::StrCat("must be ROLE_PREFILL, ROLE_DECODE or ROLE_BOTH, got ",
                             v1::Role_IsValid(change.role) ? v1::Role_Name(change.role)
                                                           : absl::StrCat(change.role)));
  }
  if (change.drain_timeout < absl::ZeroDuration() || change.drain_timeout > kMaxDrainTimeout) {
    return InvalidArgumentForField(
        "drain_timeout",
        absl::StrCat("must be in [0, 1h], got ", absl::FormatDuration(change.drain_timeout)));
  }
  absl::MutexLock lock(&mu_);
  if (change.directive_id != 0 && change.directive_id < last_directive_id_) {
    return absl::FailedPreconditionError(absl::StrCat("directive ", change.directive_id,
                                                      " is stale: directive ", last_directive_id_,
                                                      " was already applied"));
  }
  if (change_id_ != 0) {
    return absl::AbortedError(absl::StrCat("a role change from ", v1::Role_Name(role_), " to ",
                                           v1::Role_Name(pending_role_), " is in progress"));
  }
  if (change.role == role_) {
    last_directive_id_ = std::max(last_directive_id_, change.directive_id);
    return Started{.change_id = 0, .result = {.previous_role = role_, .role = role_}};
  }
  if (!options_.has_kv_transport && change.role != v1::ROLE_BOTH) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker has no KV transport, so it can only serve role ROLE_BOTH, not ",
        v1::Role_Name(change.role),
        " (start it with --kv_transport=ucx to allow switching to prefill or decode)"));
  }
  change_id_ = next_change_id_++;
  change_ = change;
  change_start_ = clock_->Now();
  announcing_ = options_.announce > absl::ZeroDuration();
  cut_short_ = false;
  pending_role_ = change.role;
  change_in_flight_ = LosingInFlightLocked();
  TRIDENT_LOG(INFO) << "role change " << v1::Role_Name(role_) << " -> "
                    << v1::Role_Name(change.role) << " (directive " << change.directive_id
                    << (change.reason.empty() ? "" : ", reason: ") << change.reason << "): no new "
                    << LostCapabilities(role_, change.role) << " work; draining "
                    << change_in_flight_ << " in flight for up to "
                    << absl::FormatDuration(change.drain_timeout);
  return Started{.change_id = change_id_};
}

void WorkerRole::WaitLocked(const std::function<bool()>& done, absl::Time deadline,
                            bool cut_short_ends) {
  auto finished = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done() || (cut_short_ends && cut_short_);
  };
  // Work ending (or CutDrainShort) releases mu_, which re-evaluates the
  // condition: no polling of the work. Only the clock is re-read, at the
  // deadline or every clock_recheck_interval.
  while (!finished()) {
    const absl::Time now = clock_->Now();
    if (now >= deadline) return;
    mu_.AwaitWithTimeout(absl::Condition(&finished),
                         std::min(deadline - now, options_.clock_recheck_interval));
  }
}

RoleChangeResult WorkerRole::FinishChange(uint64_t change_id) {
  std::vector<AbortHook> hooks;
  RoleChangeResult result;
  absl::Status why;
  mu_.Lock();
  TRIDENT_CHECK(change_id != 0 && change_id == change_id_);
  const RoleChange change = change_;
  const absl::Time start = change_start_;
  result.previous_role = role_;
  result.role = change.role;
  auto drained = [this]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return LosingInFlightLocked() == 0; };
  if (announcing_) {
    // Still admitting while routers learn of the change from load samples.
    WaitLocked([] { return false; }, start + std::min(options_.announce, change.drain_timeout),
               /*cut_short_ends=*/true);
    announcing_ = false;
  }
  const int32_t initially = change_in_flight_;
  WaitLocked(drained, start + change.drain_timeout, /*cut_short_ends=*/true);
  why = absl::AbortedError(absl::StrCat(
      "the worker is switching its role from ", v1::Role_Name(role_), " to ",
      v1::Role_Name(change.role), " and this request did not finish within the drain timeout (",
      absl::FormatDuration(change.drain_timeout), ")"));
  std::vector<std::string> aborted_ids;
  for (auto& [id, entry] : work_) {
    if (!LosingLocked(entry.capability)) continue;
    aborted_ids.push_back(entry.request_id);
    if (entry.abort) hooks.push_back(std::move(entry.abort));
    entry.abort = nullptr;
  }
  result.aborted_sequences = static_cast<int32_t>(aborted_ids.size());
  result.drained_sequences = initially - result.aborted_sequences;
  if (!aborted_ids.empty()) {
    const absl::Time grace_end = clock_->Now() + options_.abort_grace;
    mu_.Unlock();
    for (const std::string& id : aborted_ids) {
      TRIDENT_LOG(WARNING) << "role change: aborting request " << id;
    }
    for (const AbortHook& hook : hooks) hook(why);
    mu_.Lock();
    WaitLocked(drained, grace_end, /*cut_short_ends=*/false);
    if (const int32_t left = LosingInFlightLocked(); left > 0) {
      TRIDENT_LOG(WARNING) << "role change: " << left << " aborted requests still ending after "
                           << absl::FormatDuration(options_.abort_grace) << "; switching anyway";
    }
  }
  role_ = change.role;
  // Under mu_, so that the gauges of two changes in a row end in order.
  SetRoleGauges(role_);
  pending_role_ = v1::ROLE_UNSPECIFIED;
  change_id_ = 0;
  cut_short_ = false;
  last_directive_id_ = std::max(last_directive_id_, change.directive_id);
  result.drain_time = clock_->Now() - start;
  mu_.Unlock();
  if (prometheus::Counter* c = changes_total_[result.previous_role][result.role]; c != nullptr) {
    c->Increment();
  }
  TRIDENT_LOG(INFO) << "role is now " << v1::Role_Name(result.role) << " (was "
                    << v1::Role_Name(result.previous_role) << ") after "
                    << absl::FormatDuration(result.drain_time) << ": " << result.drained_sequences
                    << " drained, " << result.aborted_sequences << " aborted";
  return result;
}

void WorkerRole::SetRoleGauges(v1::Role role) {
  for (size_t r = 0; r < role_gauges_.size(); ++r) {
    if (role_gauges_[r] != nullptr) role_gauges_[r]->Set(static_cast<size_t>(role) == r ? 1 : 0);
  }
}

void WorkerRole::CutDrainShort(uint64_t change_id) {
  absl::MutexLock lock(&mu_);
  if (change_id != 0 && change_id == change_id_) cut_short_ = true;
}

absl::StatusOr<RoleChangeResult> WorkerRole::SetRole(const RoleChange& change) {
  absl::StatusOr<Started> started = BeginChange(change);
  if (!started.ok()) return started.status();
  if (started->change_id == 0) return started->result;
  return FinishChange(started->change_id);
}

}  // namespace trident::worker
