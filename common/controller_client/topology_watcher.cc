#include "common/controller_client/topology_watcher.h"

#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/controller_client/channel.h"
#include "common/grpc/status.h"
#include "common/logging/log.h"

namespace trident::controller_client {

namespace v1 = ::trident::v1;

// State of one WatchTopology call shared by the watcher's thread and the
// reactor's reactions, guarded by the watcher's mutex. It lives on the
// watcher thread's stack until the reactor's OnDone has run.
struct TopologyWatcher::StreamState {
  // Topologies read and not yet taken by the thread, oldest first.
  std::deque<v1::Topology> arrived;
  // The controller's initial metadata arrived.
  bool metadata = false;
  // A read failed: the call is over or ending.
  bool ended = false;
  // OnDone ran; `final_status` is the call's status.
  bool done = false;
  grpc::Status final_status;
};

// One WatchTopology call. Holds a hold from Begin until Release, so that
// OnDone cannot run (and the reactor cannot be deleted) while the watcher's
// thread may still call Cancel. Deletes itself in OnDone.
class TopologyWatcher::WatchReactor final : public grpc::ClientReadReactor<v1::Topology> {
 public:
  WatchReactor(TopologyWatcher* watcher, StreamState* state) : watcher_(watcher), state_(state) {}

  void Begin(v1::WatchTopologyRequest request) {
    request_ = std::move(request);
    watcher_->stub_->async()->WatchTopology(&context_, &request_, this);
    AddHold();
    StartRead(&topology_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }
  // After this the watcher's thread must not touch the reactor.
  void Release() { RemoveHold(); }

  void OnReadInitialMetadataDone(bool ok) override {
    if (!ok) return;
    absl::MutexLock lock(&watcher_->mu_);
    state_->metadata = true;
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&watcher_->mu_);
      if (!ok) {
        state_->ended = true;
        return;
      }
      state_->metadata = true;
      state_->arrived.push_back(std::move(topology_));
    }
    topology_.Clear();
    StartRead(&topology_);
  }

  void OnDone(const grpc::Status& status) override {
    {
      absl::MutexLock lock(&watcher_->mu_);
      state_->done = true;
      state_->final_status = status;
    }
    delete this;
  }

 private:
  TopologyWatcher* const watcher_;
  StreamState* const state_;
  grpc::ClientContext context_;
  v1::WatchTopologyRequest request_;
  v1::Topology topology_;
};

bool IsNewerTopology(const v1::Topology& candidate, const std::optional<v1::Topology>& current) {
  if (!current.has_value()) return true;
  if (candidate.controller_incarnation() != current->controller_incarnation()) return true;
  return candidate.version() > current->version();
}

absl::StatusOr<std::unique_ptr<TopologyWatcher>> TopologyWatcher::Create(
    TopologyWatcherOptions options, Callback on_topology) {
  if (options.controller_address.empty()) {
    return absl::InvalidArgumentError("TopologyWatcherOptions.controller_address is empty");
  }
  if (!on_topology) return absl::InvalidArgumentError("TopologyWatcher: no callback");
  return std::unique_ptr<TopologyWatcher>(
      new TopologyWatcher(std::move(options), std::move(on_topology)));
}

TopologyWatcher::TopologyWatcher(TopologyWatcherOptions options, Callback on_topology)
    : options_(std::move(options)),
      on_topology_(std::move(on_topology)),
      stub_(v1::Controller::NewStub(
          ControllerChannel(options_.controller_address, options_.backoff))) {}

TopologyWatcher::~TopologyWatcher() { Stop(); }

void TopologyWatcher::Start() {
  absl::MutexLock lock(&mu_);
  if (started_ || stopping_) return;
  started_ = true;
  thread_ = std::thread([this] { Run(); });
}

void TopologyWatcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  // Only the first caller finds the thread joinable; the thread cancels its
  // own stream once it sees stopping_.
  if (thread_.joinable()) thread_.join();
}

bool TopologyWatcher::connected() const {
  absl::MutexLock lock(&mu_);
  return status_.connected;
}

std::optional<v1::Topology> TopologyWatcher::last() const {
  absl::MutexLock lock(&mu_);
  return last_;
}

TopologyWatcherStatus TopologyWatcher::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

bool TopologyWatcher::Await(const std::function<bool(const TopologyWatcherStatus&)>& condition,
                            absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto holds = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return condition(status_); };
  return mu_.AwaitWithTimeout(absl::Condition(&holds), timeout);
}

void TopologyWatcher::Run() {
  Backoff backoff(options_.backoff, options_.seed);
  std::string last_logged;
  while (true) {
    bool healthy = false;
    const absl::Status ended = RunStream(&healthy);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      ++status_.disconnects;
      status_.last_error = ended;
      // A retry loop meets the same error again and again: log each new one.
      std::string text = ended.ToString();
      if (healthy || text != last_logged) {
        TRIDENT_LOG(WARNING) << text << "; "
                             << (last_.has_value()
                                     ? absl::StrCat("keeping topology version ", status_.version,
                                                    " (controller incarnation ",
                                                    status_.controller_incarnation, ")")
                                     : std::string("no topology yet"))
                             << "; reconnecting with backoff";
        last_logged = std::move(text);
      }
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (healthy) backoff.Reset();
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), backoff.Next())) return;
    }
  }
}

absl::Status TopologyWatcher::RunStream(bool* delivered) {
  StreamState state;
  v1::WatchTopologyRequest request;
  request.set_watcher_id(options_.watcher_id);
  {
    absl::MutexLock lock(&mu_);
    if (last_.has_value()) {
      request.set_known_controller_incarnation(last_->controller_incarnation());
      request.set_known_version(last_->version());
    }
  }
  auto* reactor = new WatchReactor(this, &state);
  reactor->Begin(std::move(request));
  bool cancel = false;
  while (true) {
    std::deque<v1::Topology> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || state.ended || !state.arrived.empty() ||
               (state.metadata && !status_.connected);
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) {
        cancel = true;
        break;
      }
      if (state.metadata && !state.ended && !status_.connected) {
        status_.connected = true;
        *delivered = true;
        TRIDENT_LOG(INFO) << "watching the topology at " << options_.controller_address;
      }
      batch.swap(state.arrived);
      if (batch.empty() && state.ended) break;
    }
    for (v1::Topology& topology : batch) {
      *delivered = true;
      Deliver(std::move(topology));
    }
  }
  if (cancel) reactor->Cancel();
  reactor->Release();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&state.done));
  status_.connected = false;
  const absl::Status error = FromGrpcStatus(state.final_status);
  if (error.ok()) {
    return absl::UnavailableError(absl::StrCat("WatchTopology at ", options_.controller_address,
                                               ": the controller ended the stream"));
  }
  return absl::Status(error.code(), absl::StrCat("WatchTopology at ", options_.controller_address,
                                                 ": ", error.message()));
}

bool TopologyWatcher::Deliver(v1::Topology topology) {
  {
    absl::MutexLock lock(&mu_);
    if (!IsNewerTopology(topology, last_)) return false;
  }
  // Only this thread writes last_, so the check above still holds.
  on_topology_(topology);
  absl::MutexLock lock(&mu_);
  status_.controller_incarnation = topology.controller_incarnation();
  status_.version = topology.version();
  ++status_.topologies;
  last_ = std::move(topology);
  return true;
}

}  // namespace trident::controller_client
