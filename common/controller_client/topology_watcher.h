#ifndef TRIDENT_COMMON_CONTROLLER_CLIENT_TOPOLOGY_WATCHER_H_
#define TRIDENT_COMMON_CONTROLLER_CLIENT_TOPOLOGY_WATCHER_H_

// Follows trident.v1.Controller.WatchTopology: keeps the last topology the
// controller published and hands every newer one to a callback. When the
// stream ends (the controller is unreachable, restarted or shutting down)
// the watcher keeps the last topology, reports connected() false, and
// reconnects with capped exponential backoff and jitter (backoff.h),
// naming the topology it has (known_controller_incarnation and
// known_version) so that the controller can skip resending it.
//
// A topology is newer than the last one when its controller_incarnation
// differs (a restarted controller starts its versions again) or its version
// is higher; others are dropped. Routers use this to follow the workers
// while serving with the last topology whenever the controller is away.
//
// One background thread reconnects and runs the callback; the stream's
// reads are callback-API reactions that only queue what arrived.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/controller_client/backoff.h"
#include "trident/v1/controller.grpc.pb.h"

namespace trident::controller_client {

struct TopologyWatcherOptions {
  // host:port of the controller's gRPC server. Required.
  std::string controller_address;
  // WatchTopologyRequest.watcher_id, for the controller's logs.
  std::string watcher_id;
  // Between reconnection attempts; reset once a stream delivered something.
  BackoffOptions backoff;
  // Seeds the backoff's jitter.
  uint64_t seed = 1;
};

// What the watcher knows now; a snapshot.
struct TopologyWatcherStatus {
  // A stream is open: its first topology or the controller's initial
  // metadata arrived, and it has not ended.
  bool connected = false;
  // Topologies passed to the callback.
  int64_t topologies = 0;
  // Streams that ended (each followed by a reconnection attempt).
  int64_t disconnects = 0;
  // incarnation/version of the last topology; 0 before the first.
  uint64_t controller_incarnation = 0;
  uint64_t version = 0;
  // Why the last stream ended or the last attempt failed; OK if none yet.
  absl::Status last_error;
};

// Thread-safe.
class TopologyWatcher {
 public:
  // Called with each newer topology, on the watcher's thread, one at a time
  // and in order; it may block briefly (it delays the next one).
  using Callback = std::function<void(const trident::v1::Topology&)>;

  // INVALID_ARGUMENT when controller_address is empty or `on_topology` is
  // null. Nothing is sent until Start().
  static absl::StatusOr<std::unique_ptr<TopologyWatcher>> Create(TopologyWatcherOptions options,
                                                                 Callback on_topology);

  // Stops (see Stop()).
  ~TopologyWatcher();

  TopologyWatcher(const TopologyWatcher&) = delete;
  TopologyWatcher& operator=(const TopologyWatcher&) = delete;

  // Starts the background thread. Later calls do nothing.
  void Start() ABSL_LOCKS_EXCLUDED(mu_);

  // Cancels the stream and joins the thread; no callback runs after it
  // returns. Idempotent; must not be called from the callback.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  bool connected() const ABSL_LOCKS_EXCLUDED(mu_);

  // The last topology delivered, kept while the controller is away;
  // nullopt before the first.
  std::optional<trident::v1::Topology> last() const ABSL_LOCKS_EXCLUDED(mu_);

  TopologyWatcherStatus status() const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks until `condition(status())` holds or `timeout` passes; returns
  // whether it held.
  bool Await(const std::function<bool(const TopologyWatcherStatus&)>& condition,
             absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class WatchReactor;
  struct StreamState;

  TopologyWatcher(TopologyWatcherOptions options, Callback on_topology);

  void Run();
  // Runs one stream until it ends or Stop(); returns why it ended and
  // whether it delivered anything.
  absl::Status RunStream(bool* delivered) ABSL_LOCKS_EXCLUDED(mu_);
  // Hands `topology` to the callback if it is newer than the last one.
  bool Deliver(trident::v1::Topology topology) ABSL_LOCKS_EXCLUDED(mu_);

  const TopologyWatcherOptions options_;
  const Callback on_topology_;
  std::unique_ptr<trident::v1::Controller::Stub> stub_;

  mutable absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<trident::v1::Topology> last_ ABSL_GUARDED_BY(mu_);
  TopologyWatcherStatus status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// Whether `candidate` should replace `current` (see the file comment).
bool IsNewerTopology(const trident::v1::Topology& candidate,
                     const std::optional<trident::v1::Topology>& current);

}  // namespace trident::controller_client

#endif  // TRIDENT_COMMON_CONTROLLER_CLIENT_TOPOLOGY_WATCHER_H_
