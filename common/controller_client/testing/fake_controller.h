#ifndef TRIDENT_COMMON_CONTROLLER_CLIENT_TESTING_FAKE_CONTROLLER_H_
#define TRIDENT_COMMON_CONTROLLER_CLIENT_TESTING_FAKE_CONTROLLER_H_

// A working in-memory trident.v1.Controller for tests of its clients
// (ControllerMember, TopologyWatcher, the router): membership with
// incarnations, heartbeat streams, deregistration and a published topology,
// without the real controller's liveness timers or role policy. Requests
// are judged by the controller's own rules (member_requests.h), so a
// request answers with the same status from either. Tests
// steer it (Forget a member as a restarted controller would, mark a worker
// DEAD, send a directive) and wait on what it saw with Await.
//
//   auto server = FakeControllerServer::Start({.controller_incarnation = 7});
//   ... point a client at server->address() ...
//   server->controller().Await([](const FakeControllerState& s) {
//     return s.Member("w1").heartbeats >= 3; }, absl::Seconds(30));
//
// Restarting a controller is Shutdown() and a new server on the same port
// with another controller_incarnation.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "trident/v1/controller.grpc.pb.h"

namespace trident::controller_client {

struct FakeControllerOptions {
  uint64_t controller_incarnation = 1;
  // Sent in every RegisterResponse.
  absl::Duration heartbeat_interval = absl::Milliseconds(20);
  absl::Duration dead_after = absl::Seconds(1);
};

// What the fake saw of one member id, over all its incarnations.
struct FakeMemberRecord {
  // Currently registered (not forgotten, not deregistered).
  bool registered = false;
  uint64_t incarnation = 0;
  int64_t registrations = 0;
  int64_t heartbeats = 0;
  int64_t deregistrations = 0;
  // Arrival times of the heartbeats.
  std::vector<absl::Time> heartbeat_times;
  trident::v1::HeartbeatRequest last_heartbeat;
  trident::v1::RegisterRequest last_registration;
};

// The fake's state, as Await conditions see it.
struct FakeControllerState {
  std::map<std::string, FakeMemberRecord> members;
  trident::v1::Topology topology;
  int32_t open_heartbeat_streams = 0;
  int32_t open_watch_streams = 0;
  int64_t watch_calls = 0;
  // The request of the last WatchTopology call.
  trident::v1::WatchTopologyRequest last_watch_request;

  // The record of `member_id`; an empty one if never seen.
  const FakeMemberRecord& Member(const std::string& member_id) const;
};

// Thread-safe.
class FakeController final : public trident::v1::Controller::CallbackService {
 public:
  explicit FakeController(FakeControllerOptions options);
  ~FakeController() override;

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const trident::v1::RegisterRequest* request,
                                     trident::v1::RegisterResponse* response) override;
  grpc::ServerBidiReactor<trident::v1::HeartbeatRequest, trident::v1::HeartbeatResponse>* Heartbeat(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Deregister(grpc::CallbackServerContext* context,
                                       const trident::v1::DeregisterRequest* request,
                                       trident::v1::DeregisterResponse* response) override;
  grpc::ServerUnaryReactor* GetTopology(grpc::CallbackServerContext* context,
                                        const trident::v1::GetTopologyRequest* request,
                                        trident::v1::Topology* response) override;
  grpc::ServerWriteReactor<trident::v1::Topology>* WatchTopology(
      grpc::CallbackServerContext* context,
      const trident::v1::WatchTopologyRequest* request) override;

  // Registers a member directly, as the RPC would (tests of watchers that
  // need workers without running them).
  absl::Status AddMember(const trident::v1::RegisterRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets `member_id` as a restarted controller would: its entry leaves
  // the topology and its open heartbeat streams end with NOT_FOUND.
  void Forget(const std::string& member_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Sets a worker's state in the topology (e.g. SERVING_STATE_DEAD) and
  // publishes the change. NOT_FOUND if it is not registered.
  absl::Status SetWorkerState(const std::string& worker_id, trident::v1::ServingState state)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Sends `response` on every open heartbeat stream of `member_id`;
  // returns how many streams took it.
  int SendToMember(const std::string& member_id, const trident::v1::HeartbeatResponse& response)
      ABSL_LOCKS_EXCLUDED(mu_);

  FakeControllerState state() const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until `condition` holds of the state or `timeout` passes;
  // returns whether it held.
  bool Await(const std::function<bool(const FakeControllerState&)>& condition,
             absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class HeartbeatStream;
  class WatchStream;

  absl::Status RegisterLocked(const trident::v1::RegisterRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status HeartbeatLocked(const trident::v1::HeartbeatRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status DeregisterLocked(const trident::v1::DeregisterRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CheckMemberIncarnation against the registered members.
  absl::Status CheckIncarnationLocked(const std::string& member_id, uint64_t incarnation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the entry of `member_id` from the topology.
  void RemoveEntryLocked(const std::string& member_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bumps the version and offers the topology to every watcher.
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const FakeControllerOptions options_;
  mutable absl::Mutex mu_;
  FakeControllerState state_ ABSL_GUARDED_BY(mu_);
  std::set<HeartbeatStream*> heartbeat_streams_ ABSL_GUARDED_BY(mu_);
  std::set<WatchStream*> watch_streams_ ABSL_GUARDED_BY(mu_);
};

// A FakeController served on 127.0.0.1. Thread-safe.
class FakeControllerServer {
 public:
  // Serves on `port` (0: a free one). UNAVAILABLE if it cannot bind.
  static absl::StatusOr<std::unique_ptr<FakeControllerServer>> Start(FakeControllerOptions options,
                                                                     int port = 0);
  // Shuts down (see Shutdown()).
  ~FakeControllerServer();

  // Cancels every open call at once and stops serving, as a controller
  // that died would. Idempotent.
  void Shutdown();

  int port() const { return port_; }
  std::string address() const;
  FakeController& controller() { return *controller_; }

 private:
  FakeControllerServer(std::unique_ptr<FakeController> controller,
                       std::unique_ptr<grpc::Server> server, int port);

  std::unique_ptr<FakeController> controller_;
  std::unique_ptr<grpc::Server> server_;
  const int port_;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace trident::controller_client

#endif  // TRIDENT_COMMON_CONTROLLER_CLIENT_TESTING_FAKE_CONTROLLER_H_
