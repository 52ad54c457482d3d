#include "services/router/load_subscriber.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc/status.h"
#include "common/grpc/tls.h"
#include "common/logging/log.h"
#include "common/time/proto_time.h"

namespace trident::router {

struct LoadSubscriber::Worker {
  std::string address;
  std::unique_ptr<trident::v1::WorkerControl::Stub> stub;
  // The stream in progress, for cancellation (guarded by the owner's mu_).
  grpc::ClientContext* context = nullptr;
  // No longer followed: the thread ends (guarded by the owner's mu_).
  bool removed = false;
  std::thread thread;
};

LoadSubscriber::LoadSubscriber(std::vector<std::string> addresses, LoadCallbacks callbacks,
                               LoadSubscriberOptions options)
    : callbacks_(std::move(callbacks)), options_(options) {
  absl::MutexLock lock(&mu_);
  for (const std::string& address : addresses) AddLocked(address);
}

LoadSubscriber::~LoadSubscriber() {
  absl::MutexLock set_lock(&set_mu_);
  std::map<std::string, std::unique_ptr<Worker>> workers;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [address, w] : workers_) {
      if (w->context != nullptr) w->context->TryCancel();
    }
    workers.swap(workers_);
  }
  for (auto& [address, w] : workers) w->thread.join();
}

void LoadSubscriber::AddLocked(const std::string& address) {
  if (workers_.count(address) > 0) return;
  auto w = std::make_unique<Worker>();
  w->address = address;
  w->stub = trident::v1::WorkerControl::NewStub(CreateClusterChannel(address));
  Worker* worker = w.get();
  workers_.emplace(address, std::move(w));
  worker->thread = std::thread([this, worker] { Run(worker); });
}

void LoadSubscriber::SetAddresses(const std::vector<std::string>& addresses) {
  absl::MutexLock set_lock(&set_mu_);
  const std::set<std::string> wanted(addresses.begin(), addresses.end());
  std::vector<std::unique_ptr<Worker>> removed;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (wanted.count(it->first) > 0) {
        ++it;
        continue;
      }
      it->second->removed = true;
      if (it->second->context != nullptr) it->second->context->TryCancel();
      removed.push_back(std::move(it->second));
      it = workers_.erase(it);
    }
    for (const std::string& address : wanted) AddLocked(address);
  }
  for (auto& w : removed) {
    w->thread.join();
    TRIDENT_LOG(INFO) << "no longer following the load of " << w->address;
    if (callbacks_.on_down) {
      callbacks_.on_down(w->address, absl::CancelledError(absl::StrCat(
                                         w->address, " is no longer in the worker set")));
    }
  }
}

std::vector<std::string> LoadSubscriber::addresses() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [address, w] : workers_) out.push_back(address);
  return out;
}

void LoadSubscriber::Run(Worker* worker) {
  bool down_reported = false;
  auto ending = [this, worker]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || worker->removed; };
  while (true) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (ending()) return;
      worker->context = &context;
    }
    trident::v1::GetLoadRequest request;
    SetProtoDuration(options_.interval, request.mutable_interval());
    auto reader = worker->stub->GetLoad(&context, request);
    trident::v1::WorkerLoad load;
    bool got_any = false;
    while (reader->Read(&load)) {
      if (!got_any) {
        TRIDENT_LOG(INFO) << "load stream from " << worker->address << " (worker "
                          << load.worker_id() << ") up";
      }
      got_any = true;
      down_reported = false;
      if (callbacks_.on_load) callbacks_.on_load(worker->address, load);
    }
    const grpc::Status status = reader->Finish();
    absl::MutexLock lock(&mu_);
    worker->context = nullptr;
    if (ending()) return;
    if (!down_reported) {
      down_reported = true;
      const absl::Status why =
          FromGrpcStatus(status, absl::StrCat("load stream from ", worker->address, " ended"));
      TRIDENT_LOG(WARNING) << why;
      mu_.Unlock();
      if (callbacks_.on_down) callbacks_.on_down(worker->address, why);
      mu_.Lock();
    }
    mu_.AwaitWithTimeout(absl::Condition(&ending), options_.retry);
    if (ending()) return;
  }
}

}  // namespace trident::router
