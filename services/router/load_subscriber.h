// The router's view of worker load: one WorkerControl.GetLoad stream per
// worker, reconnected after a failure. Each sample goes to on_load; a stream
// that ends (the worker died, restarted or is unreachable) is reported to
// on_down once per outage, so admission stops choosing that worker at once
// instead of waiting for its last sample to go stale.
//
// The set of workers can change while it runs (SetAddresses: the router
// follows the controller's topology): new addresses get a stream, removed
// ones have theirs cancelled and are reported to on_down one last time.

#ifndef TRIDENT_SERVICES_ROUTER_LOAD_SUBSCRIBER_H_
#define TRIDENT_SERVICES_ROUTER_LOAD_SUBSCRIBER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident::router {

struct LoadSubscriberOptions {
  // Asked of each worker (GetLoadRequest.interval).
  absl::Duration interval = absl::Milliseconds(100);
  // Wait before reconnecting after a stream ended.
  absl::Duration retry = absl::Seconds(1);
};

// Callbacks run on the subscriber's threads (one per worker, and the caller
// of SetAddresses for removed workers) and must be thread-safe and quick.
struct LoadCallbacks {
  std::function<void(const std::string& address, const trident::v1::WorkerLoad& load)> on_load;
  std::function<void(const std::string& address, const absl::Status& why)> on_down;
};

// Thread-safe.
class LoadSubscriber {
 public:
  // Starts a stream for each of `addresses` (duplicates ignored).
  LoadSubscriber(std::vector<std::string> addresses, LoadCallbacks callbacks,
                 LoadSubscriberOptions options);
  // Cancels every stream and joins the threads.
  ~LoadSubscriber();

  // Makes `addresses` (duplicates ignored) the set followed: starts a
  // stream for each new address; for each one no longer named, cancels its
  // stream, joins its thread, then reports it to on_down (CANCELLED: no
  // longer in the worker set), after which no callback names it until it
  // is added again. Returns once done. Calls are serialized; must not be
  // called from a callback.
  void SetAddresses(const std::vector<std::string>& addresses) ABSL_LOCKS_EXCLUDED(mu_);

  // The addresses followed now, sorted.
  std::vector<std::string> addresses() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Worker;
  // Starts following `address`.
  void AddLocked(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(Worker* worker);

  const LoadCallbacks callbacks_;
  const LoadSubscriberOptions options_;
  // Serializes SetAddresses (and the destructor), so that removals report
  // in order.
  absl::Mutex set_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::router

#endif  // TRIDENT_SERVICES_ROUTER_LOAD_SUBSCRIBER_H_
