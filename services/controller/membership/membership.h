#ifndef TRIDENT_SERVICES_CONTROLLER_MEMBERSHIP_MEMBERSHIP_H_
#define TRIDENT_SERVICES_CONTROLLER_MEMBERSHIP_MEMBERSHIP_H_

// The controller's membership: the workers and attention services that
// registered, their heartbeats, and the topology built from them
// (trident.v1.Controller's Register, Heartbeat, Deregister and topology;
// proto/trident/v1/controller.proto documents the rules).
//
//   event                                   effect                      version
//   Register, new id                        entry added, SERVING        +1
//   Register, known id, same incarnation    refreshed (idempotent)      -
//   Register, known id, other incarnation   entry replaced              +1
//   Heartbeat                               last heartbeat, load, and   +1 if role,
//                                           role/state/pending role     state or pending
//                                           from the member's report    role changed
//   Deregister                              entry removed               +1
//   ExpireSilent, silent >= dead_after      SERVING_STATE_DEAD          +1
//   a DEAD member heartbeats again          back to its reported state  +1
//   SetOrderedRole (a flip under way)       pending_role shown          +1
//
// Load figures alone change no version: the topology carries the load of
// its last change, as WatchTopology promises.
//
// Changes reach listeners (WatchTopology streams) with the topology after
// the change, in version order (they are called under the membership's
// lock, so they must be quick and must not call back into it).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/time/clock.h"
#include "services/controller/policy/role_policy.h"
#include "trident/v1/controller.pb.h"

namespace trident::controller {

struct MembershipOptions {
  // How often members heartbeat (RegisterResponse.heartbeat_interval).
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Silence after which a member is DEAD; more than heartbeat_interval.
  absl::Duration dead_after = absl::Seconds(5);
  // This controller's incarnation; nonzero.
  uint64_t controller_incarnation = 0;
};

// kInvalidArgument naming the first option out of range.
absl::Status ValidateMembershipOptions(const MembershipOptions& options);

// Thread-safe.
class Membership {
 public:
  using Listener = std::function<void(const trident::v1::Topology&)>;

  // `clock` is not owned and must outlive the membership.
  static absl::StatusOr<std::unique_ptr<Membership>> Create(MembershipOptions options,
                                                            const Clock* clock);

  // kInvalidArgument naming the bad field (no member, empty or overlong id,
  // zero incarnation, no address, a worker without a role).
  absl::StatusOr<trident::v1::RegisterResponse> Register(
      const trident::v1::RegisterRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  // kNotFound for an unknown id (register again), kFailedPrecondition for
  // another incarnation, kInvalidArgument for a load of the wrong kind or a
  // state other than SERVING or DRAINING.
  absl::Status Heartbeat(const trident::v1::HeartbeatRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  // kNotFound, kFailedPrecondition as Heartbeat.
  absl::Status Deregister(const trident::v1::DeregisterRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Marks DEAD the members whose last heartbeat (or registration) is at
  // least dead_after old; returns how many it marked.
  int ExpireSilent() ABSL_LOCKS_EXCLUDED(mu_);

  // Records that the controller ordered `worker_id` to switch to `role`
  // (ROLE_UNSPECIFIED: the order ended, whatever its outcome): the topology
  // shows it as the worker's pending role until the worker reports the role
  // in effect. kNotFound for an unknown worker.
  absl::Status SetOrderedRole(const std::string& worker_id, trident::v1::Role role)
      ABSL_LOCKS_EXCLUDED(mu_);

  trident::v1::Topology Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

  // The workers as the role policy sees them: serving only when SERVING,
  // not DEAD and with no pending role; load = running + waiting sequences;
  // role_change_time = the last role change seen, else the registration.
  std::vector<WorkerState> PolicyWorkers() const ABSL_LOCKS_EXCLUDED(mu_);

  // A worker's gRPC address; kNotFound if unknown.
  absl::StatusOr<std::string> WorkerAddress(const std::string& worker_id) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // `listener` is called after every change with the new topology, on the
  // thread that made the change; it must be quick and must not call back
  // into the membership. Returns an id for RemoveListener, after which the
  // listener is never called again.
  int64_t AddListener(Listener listener) ABSL_LOCKS_EXCLUDED(listeners_mu_);
  void RemoveListener(int64_t id) ABSL_LOCKS_EXCLUDED(listeners_mu_);

  const MembershipOptions& options() const { return options_; }

 private:
  struct Member {
    bool is_worker = true;
    trident::v1::WorkerEntry worker;
    trident::v1::AttentionServiceEntry attention;
    absl::Time last_heard;
    absl::Time role_change_time;
    // The role a flip ordered, until the worker reports it.
    trident::v1::Role ordered_role = trident::v1::ROLE_UNSPECIFIED;
  };

  Membership(MembershipOptions options, const Clock* clock)
      : options_(std::move(options)), clock_(clock) {}

  // Looks up `id` with `incarnation`: kNotFound or kFailedPrecondition.
  absl::StatusOr<Member*> Find(const std::string& id, uint64_t incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies one worker heartbeat; true if the topology changed.
  bool ApplyWorkerHeartbeat(Member& member, const trident::v1::HeartbeatRequest& request,
                            absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the pending role the topology shows.
  static void RefreshPendingRole(Member& member);
  trident::v1::Topology SnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bumps the version and calls every listener with the new topology.
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) ABSL_LOCKS_EXCLUDED(listeners_mu_);

  const MembershipOptions options_;
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, Member> members_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Time update_time_ ABSL_GUARDED_BY(mu_);
  // Held while listeners run, so RemoveListener waits for a running call.
  absl::Mutex listeners_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::map<int64_t, Listener> listeners_ ABSL_GUARDED_BY(listeners_mu_);
  int64_t next_listener_ ABSL_GUARDED_BY(listeners_mu_) = 1;
};

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_MEMBERSHIP_MEMBERSHIP_H_
