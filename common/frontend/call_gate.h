// What decides whether the front end takes a new Generate call, and keeps
// track of it while it runs. A worker's gate is its role (a call is admitted
// only in role `both`, and a role change drains or aborts calls in flight);
// the router has none.

#ifndef TRIDENT_COMMON_FRONTEND_CALL_GATE_H_
#define TRIDENT_COMMON_FRONTEND_CALL_GATE_H_

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trident::frontend {

// Held while an admitted call runs; destroying it tells the gate the call
// ended.
class CallTicket {
 public:
  virtual ~CallTicket() = default;
};

// Thread-safe.
class CallGate {
 public:
  // Called (at most once, from any thread) when the gate must end a call
  // before it finishes: the front end ends the call with `why` and aborts
  // the request in its token source. It may run concurrently with the call's
  // own end, so it holds no pointer into the call that may dangle.
  using AbortHook = std::function<void(const absl::Status& why)>;

  virtual ~CallGate() = default;

  // Admits the call for `request_id`, or says why not (the status the
  // client gets: FAILED_PRECONDITION when this server does not take such
  // calls, UNAVAILABLE while it drains them away).
  virtual absl::StatusOr<std::unique_ptr<CallTicket>> Admit(absl::string_view request_id,
                                                            AbortHook abort) = 0;
};

}  // namespace trident::frontend

#endif  // TRIDENT_COMMON_FRONTEND_CALL_GATE_H_
