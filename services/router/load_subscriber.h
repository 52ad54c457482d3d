// The router's view of worker load: one WorkerControl.GetLoad stream per
// worker, reconnected after a failure. Each sample goes to on_load; a stream
// that ends (the worker died, restarted or is unreachable) is reported to
// on_down once per outage, so admission stops choosing that worker at once
// instead of waiting for its last sample to go stale.

#ifndef TRIDENT_SERVICES_ROUTER_LOAD_SUBSCRIBER_H_
#define TRIDENT_SERVICES_ROUTER_LOAD_SUBSCRIBER_H_

#include <functional>
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

// Callbacks run on the subscriber's threads (one per worker) and must be
// thread-safe and quick.
struct LoadCallbacks {
  std::function<void(const std::string& address, const trident::v1::WorkerLoad& load)> on_load;
  std::function<void(const std::string& address, const absl::Status& why)> on_down;
};

// Thread-safe.
class LoadSubscriber {
 public:
  LoadSubscriber(std::vector<std::string> addresses, LoadCallbacks callbacks,
                 LoadSubscriberOptions options);
  // Cancels every stream and joins the threads.
  ~LoadSubscriber();

 private:
  struct Worker;
  void Run(Worker* worker);

  const LoadCallbacks callbacks_;
  const LoadSubscriberOptions options_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace trident::router

#endif  // TRIDENT_SERVICES_ROUTER_LOAD_SUBSCRIBER_H_
