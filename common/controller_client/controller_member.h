#ifndef TRIDENT_COMMON_CONTROLLER_CLIENT_CONTROLLER_MEMBER_H_
#define TRIDENT_COMMON_CONTROLLER_CLIENT_CONTROLLER_MEMBER_H_

// A cluster member's side of trident.v1.Controller membership (see
// proto/trident/v1/controller.proto): register, keep a Heartbeat stream,
// deregister on the way out. Workers and attention services run one each.
//
//            Start()
//               │
//               ▼        error: back off, retry
//   ┌──────▶ Register ◀──────────┐
//   │           │ OK             │
//   │           ▼                │
//   │    Heartbeat stream ───────┘ (never registered yet)
//   │      one message per heartbeat_interval; responses (directives)
//   │      go to on_response
//   │           │ the stream ends
//   │           ├── NOT_FOUND (the controller forgot us, e.g. restarted):
//   └───────────┘   back off, register again
//               │
//               └── anything else (unreachable, UNAVAILABLE): back off,
//                   open a new stream; a controller that restarted in
//                   between answers it NOT_FOUND, so we register again
//
//   Stop(): cancels whatever is in flight, then Deregister (best effort,
//   bounded by `deregister_timeout`) if registered.
//
// Each registration asks `build_registration` for a fresh RegisterRequest,
// so what the member reports (capacity, role) is current. A registration
// whose answer carries a controller_incarnation different from the last one
// is counted as a controller restart.
//
// Backoff is capped exponential with jitter (backoff.h), reset once a
// registration succeeds or a heartbeat stream has lived two intervals. The
// gRPC channel's own reconnect backoff is set to the same bounds, so that a
// controller coming back is seen within `backoff.max`.
//
// One background thread runs the whole protocol; the Heartbeat stream's
// reads and writes are callback-API reactions that only move state.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/controller_client/backoff.h"
#include "grpcpp/grpcpp.h"
#include "trident/v1/controller.grpc.pb.h"

namespace trident::controller_client {

struct ControllerMemberOptions {
  // host:port of the controller's gRPC server. Required.
  std::string controller_address;
  // Builds the request of each registration; called on the member's
  // thread. Exactly one of `worker` and `attention` must be set, with a
  // non-empty id and a nonzero incarnation, else the registration fails
  // locally with INVALID_ARGUMENT (and is retried, in case the builder
  // depends on state that changes). Required.
  std::function<trident::v1::RegisterRequest()> build_registration;
  // Fills a heartbeat's state and load (and applied_directive_id, if the
  // member applies directives); member_id and incarnation are set by the
  // member afterwards. Called on the member's thread before every
  // heartbeat: thread-safe and quick. Null: state SERVING, no load.
  std::function<void(trident::v1::HeartbeatRequest*)> fill_heartbeat;
  // Called with every message the controller sends on the heartbeat stream
  // (role directives), on a gRPC thread: quick and non-blocking. Null: the
  // directives are logged and otherwise ignored.
  std::function<void(const trident::v1::HeartbeatResponse&)> on_response;
  // Between attempts after a failure (Register failed, the stream ended).
  BackoffOptions backoff;
  // Seeds the backoff's jitter; give each process its own (e.g. its
  // incarnation) so that members do not retry in lockstep.
  uint64_t seed = 1;
  // Deadline of each Register call.
  absl::Duration register_timeout = absl::Seconds(5);
  // Deadline of the Deregister call in Stop().
  absl::Duration deregister_timeout = absl::Seconds(2);
  // Interval used when a RegisterResponse leaves heartbeat_interval unset
  // (or not positive).
  absl::Duration default_heartbeat_interval = absl::Seconds(1);
  // A heartbeat write outstanding for longer than this (or than the
  // registration's dead_after, when that is longer) means the stream is
  // stuck (e.g. the controller's host vanished without closing the
  // connection): the stream is cancelled and reopened.
  absl::Duration stalled_write_timeout = absl::Seconds(10);
  // Why Stop() deregisters, for the controller's logs.
  std::string deregister_reason = "shutting down";
};

// What the member knows now; a snapshot.
struct ControllerMemberStatus {
  // A registration succeeded and no heartbeat stream has ended NOT_FOUND
  // since, and Stop() has not deregistered.
  bool registered = false;
  // A heartbeat stream is open.
  bool heartbeating = false;
  // controller_incarnation of the last successful registration; 0 before.
  uint64_t controller_incarnation = 0;
  // Successful registrations, the first included, and failed attempts.
  int64_t registrations = 0;
  int64_t failed_registrations = 0;
  // Registrations whose controller_incarnation differed from the previous
  // registration's.
  int64_t controller_restarts = 0;
  // Heartbeats written to a stream (OnWriteDone with ok).
  int64_t heartbeats_sent = 0;
  // Messages received on heartbeat streams.
  int64_t responses_received = 0;
  // The interval the last registration set.
  absl::Duration heartbeat_interval = absl::ZeroDuration();
  // The last failure (Register, the stream, Deregister), with what failed
  // and where in the message; OK if none yet.
  absl::Status last_error;
  // Stop() ran a Deregister that succeeded.
  bool deregistered = false;
};

// Thread-safe.
class ControllerMember {
 public:
  // Validates the options (INVALID_ARGUMENT naming the one missing) and
  // makes the channel; nothing is sent until Start().
  static absl::StatusOr<std::unique_ptr<ControllerMember>> Create(ControllerMemberOptions options);

  // Stops (see Stop()).
  ~ControllerMember();

  ControllerMember(const ControllerMember&) = delete;
  ControllerMember& operator=(const ControllerMember&) = delete;

  // Starts the background thread: register, then heartbeat. Later calls do
  // nothing.
  void Start() ABSL_LOCKS_EXCLUDED(mu_);

  // Cancels the Register call or heartbeat stream in flight, joins the
  // thread, then, if registered, calls Deregister with
  // `deregister_timeout`; its failure is only recorded in last_error (the
  // controller marks a silent member DEAD anyway). Returns once done;
  // idempotent; the member cannot be started again.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  ControllerMemberStatus status() const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until `condition(status())` holds or `timeout` passes; returns
  // whether it held. Re-evaluated whenever the status changes.
  bool Await(const std::function<bool(const ControllerMemberStatus&)>& condition,
             absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class HeartbeatReactor;
  // What a successful registration gave.
  struct Registration {
    std::string member_id;
    uint64_t incarnation = 0;
    absl::Duration interval;
    absl::Duration stall_timeout;
  };
  // How a heartbeat stream ended.
  struct StreamEnd {
    absl::Status status;
    // It lived long enough to count as healthy (resets the backoff).
    bool healthy = false;
  };

  explicit ControllerMember(ControllerMemberOptions options);

  void Run();
  absl::StatusOr<Registration> Register() ABSL_LOCKS_EXCLUDED(mu_);
  StreamEnd RunHeartbeatStream(const Registration& registration) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits `delay` or until Stop(); false when stopping.
  bool SleepUnlessStopping(absl::Duration delay) ABSL_LOCKS_EXCLUDED(mu_);
  void Deregister(const Registration& registration) ABSL_LOCKS_EXCLUDED(mu_);
  // Passes a message of the heartbeat stream (or a registration's
  // directive) to on_response, or logs it.
  void HandleResponse(const trident::v1::HeartbeatResponse& response) ABSL_LOCKS_EXCLUDED(mu_);
  // Sets last_error and logs it unless it repeats the last one logged.
  void RecordError(const absl::Status& error, bool retrying = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ControllerMemberOptions options_;
  std::unique_ptr<trident::v1::Controller::Stub> stub_;

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  // The Register call in flight, to cancel on Stop.
  grpc::ClientContext* register_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  // The last successful registration, for Deregister.
  std::unique_ptr<Registration> registration_ ABSL_GUARDED_BY(mu_);
  ControllerMemberStatus status_ ABSL_GUARDED_BY(mu_);
  // The last error logged, so that a retry loop logs each new error once.
  std::string last_logged_error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// The member id and incarnation a RegisterRequest names: worker_id or
// service_id. INVALID_ARGUMENT if neither member is set, the id is empty or
// the incarnation is 0.
absl::Status MemberIdentity(const trident::v1::RegisterRequest& request, std::string* member_id,
                            uint64_t* incarnation);

}  // namespace trident::controller_client

#endif  // TRIDENT_COMMON_CONTROLLER_CLIENT_CONTROLLER_MEMBER_H_
