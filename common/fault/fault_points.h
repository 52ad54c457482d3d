// Named fault points: places in the code where a test makes a process fail
// on purpose, at exactly that point (etcd's failpoints, FoundationDB's
// BUGGIFY). Off unless armed, and then one relaxed atomic load per pass.
//
// A process arms points from its --fault_points flag (every service takes
// it; see common/service) or, in unit tests, with ArmFaultPoints:
//
//   --fault_points=prefill.transfer=crash,decode.token=hang@20
//
// Each entry is name=action[@skip]: the point passes `skip` times (default
// 0), then acts on every later pass:
//   crash  the process kills itself with SIGKILL (as kill -9 would, at
//          exactly this point);
//   hang   the calling thread blocks forever (a wedged process; its other
//          threads, keepalive included, go on);
//   fail   the point reports UNAVAILABLE to its caller, which fails the
//          work in hand as it would for that error.
// An entry written name=action[@skip]~ waits for SIGUSR2: the point passes
// freely until the process receives it (a test warms a cluster up, then
// sets the fault off), then counts its skips and acts.
// Every point counts its hits, so a test can tell that a fault happened.
//
// The points in the code (grep TRIDENT_FAULT_POINT) are listed in the
// README's fault matrix.

#ifndef TRIDENT_COMMON_FAULT_FAULT_POINTS_H_
#define TRIDENT_COMMON_FAULT_FAULT_POINTS_H_

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trident::fault {

// Parses and arms `spec` (replacing any armed points). INVALID_ARGUMENT
// naming the entry for a malformed one or an unknown action. Empty: none.
absl::Status ArmFaultPoints(absl::string_view spec);

// The slow path of TRIDENT_FAULT_POINT: acts on an armed point (crash and
// hang do not return); returns UNAVAILABLE for `fail`, OK otherwise.
absl::Status HitFaultPoint(absl::string_view name);

// How many times `name` has acted (crash excluded, for obvious reasons).
int64_t FaultPointActions(absl::string_view name);

namespace internal {
extern std::atomic<bool> any_armed;
}  // namespace internal

// OK unless the point is armed and due (see above).
inline absl::Status FaultPoint(absl::string_view name) {
  if (!internal::any_armed.load(std::memory_order_relaxed)) return absl::OkStatus();
  return HitFaultPoint(name);
}

}  // namespace trident::fault

#endif  // TRIDENT_COMMON_FAULT_FAULT_POINTS_H_
