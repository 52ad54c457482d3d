#include "common/grpc/health_service.h"

#include <atomic>
#include <optional>

#include "common/logging/log.h"

namespace trident {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;

// One Watch stream. Keeps one write in flight; a status that changes while a
// write is in flight is sent after it, and only the latest one. gRPC may run
// a reaction inline inside StartWrite or Finish, so neither is called with a
// lock held, and OnDone only marks the reactor: the service, which owns it,
// deletes it later under its own lock.
class HealthService::WatchReactor final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  WatchReactor(HealthService* service, std::string name)
      : service_(service), name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  bool done() const { return done_.load(std::memory_order_acquire); }

  // Queues `status` for sending; with `finish`, ends the stream after it.
  void Update(ServingStatus status, bool finish) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      pending_ = status;
      finish_ = finish_ || finish;
    }
    Pump();
  }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
    }
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "watch stream broken"));
      return;
    }
    Pump();
  }

  void OnCancel() override { FinishOnce(grpc::Status::CANCELLED); }

  void OnDone() override {
    done_.store(true, std::memory_order_release);
    service_->WatcherDone();
  }

 private:
  // Starts the next write, or the finish, if one is due.
  void Pump() ABSL_LOCKS_EXCLUDED(mu_) {
    bool write = false;
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (pending_.has_value() && *pending_ != last_sent_) {
        response_.set_status(*pending_);  // Not in flight: writing_ was false.
        last_sent_ = *pending_;
        writing_ = true;
        write = true;
      } else if (finish_) {
        finished_ = true;
        finish = true;
      }
      pending_.reset();
    }
    if (write) StartWrite(&response_);
    if (finish) Finish(grpc::Status::OK);
  }

  void FinishOnce(grpc::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(std::move(status));
  }

  HealthService* const service_;
  const std::string name_;
  std::atomic<bool> done_{false};
  absl::Mutex mu_;
  HealthCheckResponse response_;  // Written only while no write is in flight.
  std::optional<ServingStatus> pending_ ABSL_GUARDED_BY(mu_);
  std::optional<ServingStatus> last_sent_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

HealthService::~HealthService() {
  absl::MutexLock lock(&mu_);
  for (WatchReactor* watcher : watchers_) {
    TRIDENT_CHECK(watcher->done()) << "the server must shut down before its health service";
    delete watcher;
  }
}

void HealthService::SweepLocked() {
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    if ((*it)->done()) {
      delete *it;
      watchers_.erase(it++);
    } else {
      ++it;
    }
  }
}

HealthService::ServingStatus HealthService::StatusLocked(const std::string& service) const {
  auto it = statuses_.find(service);
  return it == statuses_.end() ? HealthCheckResponse::SERVICE_UNKNOWN : it->second;
}

void HealthService::SetStatus(const std::string& service, ServingStatus status) {
  absl::MutexLock lock(&mu_);
  SweepLocked();
  if (shut_down_) return;
  statuses_[service] = status;
  for (WatchReactor* watcher : watchers_) {
    if (watcher->name() == service) watcher->Update(status, /*finish=*/false);
  }
}

void HealthService::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  for (auto& [name, status] : statuses_) status = HealthCheckResponse::NOT_SERVING;
  for (WatchReactor* watcher : watchers_) {
    watcher->Update(HealthCheckResponse::NOT_SERVING, /*finish=*/true);
  }
}

void HealthService::WatcherDone() {
  absl::MutexLock lock(&open_mu_);
  --open_;
}

void HealthService::AwaitWatchersDone(absl::Time deadline) {
  absl::MutexLock lock(&open_mu_);
  open_mu_.AwaitWithDeadline(absl::Condition(
                                 +[](int64_t* open) { return *open == 0; }, &open_),
                             deadline);
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::MutexLock lock(&mu_);
  const ServingStatus status = StatusLocked(request->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    reactor->Finish(
        grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service '" + request->service() + "'"));
  } else {
    response->set_status(status);
    reactor->Finish(grpc::Status::OK);
  }
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* context, const HealthCheckRequest* request) {
  {
    absl::MutexLock open(&open_mu_);
    ++open_;
  }
  auto* reactor = new WatchReactor(this, request->service());
  absl::MutexLock lock(&mu_);
  SweepLocked();
  watchers_.insert(reactor);
  reactor->Update(StatusLocked(request->service()), /*finish=*/shut_down_);
  return reactor;
}

}  // namespace trident
