#include "services/router/load_subscriber.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/time/proto_time.h"

namespace trident::router {

struct LoadSubscriber::Worker {
  std::string address;
  std::unique_ptr<trident::v1::WorkerControl::Stub> stub;
  // The stream in progress, for cancellation (guarded by the owner's mu_).
  grpc::ClientContext* context = nullptr;
  std::thread thread;
};

LoadSubscriber::LoadSubscriber(std::vector<std::string> addresses, LoadCallbacks callbacks,
                               LoadSubscriberOptions options)
    : callbacks_(std::move(callbacks)), options_(options) {
  for (std::string& address : addresses) {
    auto w = std::make_unique<Worker>();
    w->address = std::move(address);
    w->stub = trident::v1::WorkerControl::NewStub(
        grpc::CreateChannel(w->address, grpc::InsecureChannelCredentials()));
    workers_.push_back(std::move(w));
  }
  for (auto& w : workers_) {
    Worker* worker = w.get();
    worker->thread = std::thread([this, worker] { Run(worker); });
  }
}

LoadSubscriber::~LoadSubscriber() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& w : workers_) {
      if (w->context != nullptr) w->context->TryCancel();
    }
  }
  for (auto& w : workers_) w->thread.join();
}

void LoadSubscriber::Run(Worker* worker) {
  bool down_reported = false;
  while (true) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
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
    if (stopping_) return;
    if (!down_reported) {
      down_reported = true;
      const absl::Status why(
          static_cast<absl::StatusCode>(status.error_code()),
          absl::StrCat("load stream from ", worker->address, " ended: ", status.error_message()));
      TRIDENT_LOG(WARNING) << why;
      mu_.Unlock();
      if (callbacks_.on_down) callbacks_.on_down(worker->address, why);
      mu_.Lock();
    }
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    mu_.AwaitWithTimeout(absl::Condition(&stop), options_.retry);
    if (stopping_) return;
  }
}

}  // namespace trident::router
