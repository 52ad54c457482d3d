#include "services/controller/membership/membership.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/controller_client/member_requests.h"
#include "common/status/error_details.h"
#include "common/time/proto_time.h"

namespace trident::controller {
namespace {

namespace v1 = ::trident::v1;

using controller_client::ValidateHeartbeatState;
using controller_client::ValidateRegisterRequest;

}  // namespace

absl::Status ValidateMembershipOptions(const MembershipOptions& options) {
  if (options.heartbeat_interval <= absl::ZeroDuration()) {
    return InvalidArgumentForField("heartbeat_interval", "must be positive");
  }
  if (options.dead_after <= options.heartbeat_interval) {
    return InvalidArgumentForField("dead_after", "must exceed heartbeat_interval");
  }
  if (options.controller_incarnation == 0) {
    return InvalidArgumentForField("controller_incarnation", "must be nonzero");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Membership>> Membership::Create(MembershipOptions options,
                                                               const Clock* clock) {
  if (absl::Status s = ValidateMembershipOptions(options); !s.ok()) return s;
  auto membership = std::unique_ptr<Membership>(new Membership(std::move(options), clock));
  absl::MutexLock lock(&membership->mu_);
  membership->update_time_ = clock->Now();
  return membership;
}

absl::StatusOr<v1::RegisterResponse> Membership::Register(const v1::RegisterRequest& request) {
  if (absl::Status s = ValidateRegisterRequest(request); !s.ok()) return s;
  const bool is_worker = request.has_worker();
  const std::string& id =
      is_worker ? request.worker().worker_id() : request.attention().service_id();
  const uint64_t incarnation =
      is_worker ? request.worker().incarnation() : request.attention().incarnation();
  v1::RegisterResponse response;
  SetProtoDuration(options_.heartbeat_interval, response.mutable_heartbeat_interval());
  SetProtoDuration(options_.dead_after, response.mutable_dead_after());
  response.set_controller_incarnation(options_.controller_incarnation);

  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  auto it = members_.find(id);
  if (it != members_.end() && it->second.is_worker == is_worker) {
    const uint64_t known = is_worker ? it->second.worker.registration().incarnation()
                                     : it->second.attention.registration().incarnation();
    if (known == incarnation) {
      it->second.last_heard = now;
      return response;
    }
  }
  Member member;
  member.is_worker = is_worker;
  member.last_heard = now;
  member.role_change_time = now;
  if (is_worker) {
    *member.worker.mutable_registration() = request.worker();
    member.worker.set_role(request.worker().role());
    member.worker.set_state(v1::SERVING_STATE_SERVING);
    SetProtoTimestamp(now, member.worker.mutable_register_time());
    SetProtoTimestamp(now, member.worker.mutable_last_heartbeat_time());
    SetProtoTimestamp(now, member.worker.mutable_role_change_time());
  } else {
    *member.attention.mutable_registration() = request.attention();
    member.attention.set_state(v1::SERVING_STATE_SERVING);
    SetProtoTimestamp(now, member.attention.mutable_register_time());
    SetProtoTimestamp(now, member.attention.mutable_last_heartbeat_time());
  }
  members_[id] = std::move(member);
  PublishLocked();
  return response;
}

absl::StatusOr<Membership::Member*> Membership::Find(const std::string& id, uint64_t incarnation) {
  auto it = members_.find(id);
  Member* member = it == members_.end() ? nullptr : &it->second;
  const uint64_t known = member == nullptr   ? 0
                         : member->is_worker ? member->worker.registration().incarnation()
                                             : member->attention.registration().incarnation();
  if (absl::Status s = controller_client::CheckMemberIncarnation(
          id, member != nullptr, known, incarnation, options_.controller_incarnation);
      !s.ok()) {
    return s;
  }
  return member;
}

void Membership::RefreshPendingRole(Member& member) {
  v1::WorkerEntry& w = member.worker;
  if (member.ordered_role != v1::ROLE_UNSPECIFIED && w.role() == member.ordered_role) {
    member.ordered_role = v1::ROLE_UNSPECIFIED;
  }
  const v1::Role reported = w.load().pending_role();
  w.set_pending_role(reported != v1::ROLE_UNSPECIFIED ? reported : member.ordered_role);
}

bool Membership::ApplyWorkerHeartbeat(Member& member, const v1::HeartbeatRequest& request,
                                      absl::Time now) {
  v1::WorkerEntry& w = member.worker;
  const v1::Role old_role = w.role();
  const v1::ServingState old_state = w.state();
  const v1::Role old_pending = w.pending_role();
  *w.mutable_load() = request.worker_load();
  w.set_state(request.state());
  const v1::Role reported = request.worker_load().role();
  if (reported != v1::ROLE_UNSPECIFIED && reported != old_role) {
    w.set_role(reported);
    member.role_change_time = now;
    SetProtoTimestamp(now, w.mutable_role_change_time());
  }
  RefreshPendingRole(member);
  SetProtoTimestamp(now, w.mutable_last_heartbeat_time());
  return w.role() != old_role || w.state() != old_state || w.pending_role() != old_pending;
}

absl::Status Membership::Heartbeat(const v1::HeartbeatRequest& request) {
  if (absl::Status s = ValidateHeartbeatState(request.state()); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Member*> found = Find(request.member_id(), request.incarnation());
  if (!found.ok()) return found.status();
  Member& member = **found;
  const absl::Time now = clock_->Now();
  bool changed = false;
  if (absl::Status s = controller_client::ValidateHeartbeatLoad(request, member.is_worker);
      !s.ok()) {
    return s;
  }
  if (member.is_worker) {
    changed = ApplyWorkerHeartbeat(member, request, now);
  } else {
    v1::AttentionServiceEntry& a = member.attention;
    changed = a.state() != request.state();
    a.set_state(request.state());
    *a.mutable_load() = request.attention_load();
    SetProtoTimestamp(now, a.mutable_last_heartbeat_time());
  }
  member.last_heard = now;
  if (changed) PublishLocked();
  return absl::OkStatus();
}

absl::Status Membership::Deregister(const v1::DeregisterRequest& request) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Member*> found = Find(request.member_id(), request.incarnation());
  if (!found.ok()) return found.status();
  members_.erase(request.member_id());
  PublishLocked();
  return absl::OkStatus();
}

int Membership::ExpireSilent() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  int marked = 0;
  for (auto& [id, member] : members_) {
    if (now - member.last_heard < options_.dead_after) continue;
    if (member.is_worker && member.worker.state() != v1::SERVING_STATE_DEAD) {
      member.worker.set_state(v1::SERVING_STATE_DEAD);
      ++marked;
    } else if (!member.is_worker && member.attention.state() != v1::SERVING_STATE_DEAD) {
      member.attention.set_state(v1::SERVING_STATE_DEAD);
      ++marked;
    }
  }
  if (marked > 0) PublishLocked();
  return marked;
}

absl::Status Membership::SetOrderedRole(const std::string& worker_id, v1::Role role) {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(worker_id);
  if (it == members_.end() || !it->second.is_worker) {
    return absl::NotFoundError(absl::StrCat("no worker '", worker_id, "' is registered"));
  }
  Member& member = it->second;
  const v1::Role old_pending = member.worker.pending_role();
  member.ordered_role = role;
  RefreshPendingRole(member);
  if (member.worker.pending_role() != old_pending) PublishLocked();
  return absl::OkStatus();
}

v1::Topology Membership::Snapshot() const {
  absl::MutexLock lock(&mu_);
  return SnapshotLocked();
}

v1::Topology Membership::SnapshotLocked() const {
  v1::Topology topology;
  topology.set_controller_incarnation(options_.controller_incarnation);
  topology.set_version(version_);
  SetProtoTimestamp(update_time_, topology.mutable_update_time());
  for (const auto& [id, member] : members_) {
    if (member.is_worker) {
      *topology.add_workers() = member.worker;
    } else {
      *topology.add_attention_services() = member.attention;
    }
  }
  return topology;
}

std::vector<WorkerState> Membership::PolicyWorkers() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerState> workers;
  for (const auto& [id, member] : members_) {
    if (!member.is_worker) continue;
    const v1::WorkerEntry& w = member.worker;
    WorkerState state;
    state.worker_id = id;
    state.role = w.role();
    state.role_change_time = member.role_change_time;
    state.serving =
        w.state() == v1::SERVING_STATE_SERVING && w.pending_role() == v1::ROLE_UNSPECIFIED;
    state.load = w.load().running_sequences() + w.load().waiting_sequences();
    workers.push_back(std::move(state));
  }
  return workers;
}

absl::StatusOr<std::string> Membership::WorkerAddress(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  auto it = members_.find(worker_id);
  if (it == members_.end() || !it->second.is_worker) {
    return absl::NotFoundError(absl::StrCat("no worker '", worker_id, "' is registered"));
  }
  return it->second.worker.registration().address();
}

int64_t Membership::AddListener(Listener listener) {
  absl::MutexLock lock(&listeners_mu_);
  const int64_t id = next_listener_++;
  listeners_[id] = std::move(listener);
  return id;
}

void Membership::RemoveListener(int64_t id) {
  absl::MutexLock lock(&listeners_mu_);
  listeners_.erase(id);
}

void Membership::PublishLocked() {
  ++version_;
  update_time_ = clock_->Now();
  const v1::Topology topology = SnapshotLocked();
  absl::MutexLock lock(&listeners_mu_);
  for (auto& [id, listener] : listeners_) listener(topology);
}

}  // namespace trident::controller
