// A worker's role (prefill, decode or both) as it changes at run time
// (trident.v1.WorkerControl.SetRole), and the work in flight for each
// capability of that role, so that a change can drain it.
//
// Every service that starts work asks WorkerRole::Admit first and keeps the
// returned Work for as long as the work lasts:
//
//   capability   work                                      served by
//   kPrefill     a Prefill call (compute, KV transfer)      prefill, both
//   kDecode      a KV reservation, then the Decode call     decode, both
//                that continues it
//   kColocated   a Generate call, a Decode call without a   both
//                reservation
//
// A role change (BeginChange, then FinishChange) stops admitting work for
// the capabilities the new role lacks (UNAVAILABLE: the router retries
// elsewhere), waits for that work to end for up to the drain timeout, aborts
// what is left (each Work's abort hook), waits a short grace for the aborted
// work to end, then switches. Work of capabilities both roles have goes on
// untouched.

#ifndef TRIDENT_SERVICES_WORKER_WORKER_ROLE_H_
#define TRIDENT_SERVICES_WORKER_WORKER_ROLE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "common/time/clock.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "trident/v1/cluster.pb.h"

namespace trident::worker {

// What a piece of work needs from the worker's role.
enum class Capability { kPrefill, kDecode, kColocated };

// "prefill", "decode", "colocated generation".
absl::string_view CapabilityName(Capability capability);

// Whether `role` serves `capability` (see the file comment's table).
bool RoleHas(trident::v1::Role role, Capability capability);

// Asked of WorkerRole::BeginChange.
struct RoleChange {
  trident::v1::Role role = trident::v1::ROLE_UNSPECIFIED;
  // How long work in flight may take to finish; zero aborts it at once.
  // [0, 1 h].
  absl::Duration drain_timeout = absl::Seconds(30);
  // Increasing per issuer; 0 means unnumbered (always applied).
  uint64_t directive_id = 0;
  // For logs.
  std::string reason;
};

// The outcome of a role change (trident.v1.SetRoleResponse).
struct RoleChangeResult {
  trident::v1::Role previous_role = trident::v1::ROLE_UNSPECIFIED;
  trident::v1::Role role = trident::v1::ROLE_UNSPECIFIED;
  // From BeginChange to the switch.
  absl::Duration drain_time;
  // Work of the lost capabilities that ended by itself, and that was
  // aborted when the drain timeout ran out.
  int32_t drained_sequences = 0;
  int32_t aborted_sequences = 0;
};

struct WorkerRoleOptions {
  // False when the worker has no KV transport: roles prefill and decode
  // cannot move KV, so only role both may be set.
  bool has_kv_transport = true;
  // How long a change keeps admitting the work it is about to lose while it
  // announces itself (load samples show the pending role and DRAINING), so
  // that routers, which learn roles from those samples, stop sending that
  // work before the worker refuses it. Part of the drain timeout. Set it to
  // a few of the routers' load intervals.
  absl::Duration announce = absl::ZeroDuration();
  // After aborting, how long to wait for the aborted work to end before
  // switching anyway (a prefill transfer that must still send its CommitKv).
  absl::Duration abort_grace = absl::Seconds(15);
  // A waiting change wakes up for the end of work at once, but learns that
  // the clock passed its deadline only by reading the clock. With a real
  // clock it sleeps until the deadline (infinite: no extra wake-ups); tests
  // driving a FakeClock set a short interval so that Advance() is noticed.
  absl::Duration clock_recheck_interval = absl::InfiniteDuration();
  // Where trident_worker_role_changes_total{from, to} and
  // trident_worker_role{role} (1 for the role in effect, 0 for the other
  // two of prefill, decode, both; it changes when a change switches) are
  // registered; may be null (no metrics).
  prometheus::Registry* registry = nullptr;
};

// Thread-safe.
class WorkerRole {
 public:
  // Called (at most once, without locks held, on the thread finishing a role
  // change) when the drain timeout runs out while the work is in flight. It
  // must make the work end soon and tell its client `why` (an ABORTED
  // status); it may run concurrently with the work's own end, so it must
  // hold no pointer into the work that may dangle (use a weak_ptr).
  using AbortHook = std::function<void(const absl::Status& why)>;

  // Where a Work finds its WorkerRole; cleared when the WorkerRole goes, so
  // that work outliving it (e.g. held by an engine callback) ends harmlessly.
  struct Anchor {
    absl::Mutex mu;
    WorkerRole* role ABSL_GUARDED_BY(mu) = nullptr;
  };

  // One piece of admitted work; ends when destroyed (or End()). Movable,
  // thread-compatible.
  class Work {
   public:
    Work() = default;
    Work(Work&& other) noexcept;
    Work& operator=(Work&& other) noexcept;
    Work(const Work&) = delete;
    Work& operator=(const Work&) = delete;
    ~Work() { End(); }

    // Replaces the abort hook (e.g. once the work's state exists).
    void SetAbortHook(AbortHook hook);
    // Ends the work now; idempotent.
    void End();
    // False for a default-constructed, moved-from or ended Work.
    bool active() const { return anchor_ != nullptr; }

   private:
    friend class WorkerRole;
    Work(std::shared_ptr<Anchor> anchor, uint64_t id) : anchor_(std::move(anchor)), id_(id) {}
    std::shared_ptr<Anchor> anchor_;
    uint64_t id_ = 0;
  };

  WorkerRole(trident::v1::Role initial, const Clock* clock, WorkerRoleOptions options = {});
  // REQUIRES: no FinishChange running. Work still alive ends harmlessly
  // later.
  ~WorkerRole();

  WorkerRole(const WorkerRole&) = delete;
  WorkerRole& operator=(const WorkerRole&) = delete;

  struct State {
    // The role in effect.
    trident::v1::Role role = trident::v1::ROLE_UNSPECIFIED;
    // While a change drains, the role being switched to; else
    // ROLE_UNSPECIFIED.
    trident::v1::Role pending_role = trident::v1::ROLE_UNSPECIFIED;
  };
  State state() const ABSL_LOCKS_EXCLUDED(mu_);
  trident::v1::Role role() const ABSL_LOCKS_EXCLUDED(mu_);

  // Admits new work needing `capability` for request `request_id` (logs).
  // FAILED_PRECONDITION when the role lacks the capability; UNAVAILABLE
  // while a change drains it away (after its announce period).
  absl::StatusOr<Work> Admit(Capability capability, absl::string_view request_id,
                             AbortHook abort = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // Work of `capability` in flight.
  int32_t in_flight(Capability capability) const ABSL_LOCKS_EXCLUDED(mu_);

  // What BeginChange started.
  struct Started {
    // 0 when nothing was to be done (the role is already in effect):
    // `result` is then final. Else pass it to FinishChange.
    uint64_t change_id = 0;
    RoleChangeResult result;
  };
  // Starts a change without blocking: validates it (INVALID_ARGUMENT naming
  // `role` or `drain_timeout`; FAILED_PRECONDITION for a directive older
  // than the last applied, or for role prefill or decode without a KV
  // transport; ABORTED while another change is in progress) and stops
  // admitting work for the capabilities being lost.
  absl::StatusOr<Started> BeginChange(const RoleChange& change) ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until the change that BeginChange returned `change_id` for is in
  // effect: drains, aborts what is left, switches. Call once per change.
  RoleChangeResult FinishChange(uint64_t change_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Makes the drain of change `change_id` (if still waiting) stop waiting
  // and abort what is left, e.g. when its caller went away or the server
  // shuts down. No-op for another or a finished change.
  void CutDrainShort(uint64_t change_id) ABSL_LOCKS_EXCLUDED(mu_);

  // BeginChange, then FinishChange if needed.
  absl::StatusOr<RoleChangeResult> SetRole(const RoleChange& change) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    Capability capability;
    std::string request_id;
    AbortHook abort;
  };
  // Whether `capability` is being drained away by the change in progress.
  bool LosingLocked(Capability capability) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A change is announcing itself: the capabilities it loses are still
  // admitted.
  bool announcing_ ABSL_GUARDED_BY(mu_) = false;
  int32_t LosingInFlightLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `done` holds, the clock reaches `deadline`, or (if
  // `cut_short_ends`) the drain is cut short.
  void WaitLocked(const std::function<bool()>& done, absl::Time deadline, bool cut_short_ends)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndWork(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  void SetAbortHook(uint64_t id, AbortHook hook) ABSL_LOCKS_EXCLUDED(mu_);
  // trident_worker_role{role}: 1 for `role`, 0 for the others.
  void SetRoleGauges(trident::v1::Role role);

  const Clock* const clock_;
  const WorkerRoleOptions options_;
  const std::shared_ptr<Anchor> anchor_;
  // trident_worker_role_changes_total{from, to}, indexed by Role values;
  // resolved at construction (null without a registry, and for from == to).
  std::array<std::array<prometheus::Counter*, 4>, 4> changes_total_{};
  // trident_worker_role{role}, indexed by Role values; null without a
  // registry, and for ROLE_UNSPECIFIED.
  std::array<prometheus::Gauge*, 4> role_gauges_{};

  mutable absl::Mutex mu_;
  trident::v1::Role role_ ABSL_GUARDED_BY(mu_);
  trident::v1::Role pending_role_ ABSL_GUARDED_BY(mu_) = trident::v1::ROLE_UNSPECIFIED;
  // The change in progress (0: none), when it began, its request.
  uint64_t change_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_change_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Time change_start_ ABSL_GUARDED_BY(mu_);
  RoleChange change_ ABSL_GUARDED_BY(mu_);
  // Work of the lost capabilities in flight when the change began.
  int32_t change_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool cut_short_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t last_directive_id_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_work_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Entry> work_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_WORKER_ROLE_H_
