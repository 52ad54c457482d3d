#include "services/controller/controller_service.h"

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc/reactors.h"
#include "common/grpc/status.h"
#include "common/logging/log.h"
#include "common/status/error_details.h"

namespace trident::controller {
namespace {

namespace v1 = ::trident::v1;

constexpr int32_t kMaxStatusDecisions = 1000;

// Applies each heartbeat; ends the stream with the first error.
class HeartbeatReactor final
    : public grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
 public:
  explicit HeartbeatReactor(Membership* membership) : membership_(membership) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    if (absl::Status status = membership_->Heartbeat(request_); !status.ok()) {
      TRIDENT_LOG(DEBUG) << "heartbeat of " << request_.member_id() << " refused: " << status;
      Finish(ToGrpcStatus(status));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  Membership* const membership_;
  v1::HeartbeatRequest request_;
};

// Writes the newest topology whenever the previous write has completed.
class WatchReactor final : public grpc::ServerWriteReactor<v1::Topology> {
 public:
  WatchReactor(Membership* membership, const v1::WatchTopologyRequest& request)
      : membership_(membership) {
    // Headers at once, so that a watcher whose first topology is skipped
    // (it has it already) knows it is connected.
    StartSendInitialMetadata();
    listener_ = membership_->AddListener([this](const v1::Topology& t) { Offer(t); });
    const v1::Topology now = membership_->Snapshot();
    if (request.known_controller_incarnation() == now.controller_incarnation() &&
        request.known_version() == now.version()) {
      absl::MutexLock lock(&mu_);
      newest_version_ = std::max(newest_version_, now.version());
    } else {
      Offer(now);
    }
    TRIDENT_LOG(DEBUG) << "topology watch from '" << request.watcher_id() << "'";
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::UNAVAILABLE, "topology write failed"));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || newest_.version() <= sending_.version()) {
        writing_ = false;
        return;
      }
      sending_ = newest_;
    }
    StartWrite(&sending_);
  }

  void OnCancel() override { FinishOnce(grpc::Status::CANCELLED); }

  void OnDone() override {
    membership_->RemoveListener(listener_);
    delete this;
  }

 private:
  void Offer(const v1::Topology& topology) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || topology.version() <= newest_version_) return;
      newest_ = topology;
      newest_version_ = topology.version();
      if (writing_) return;
      writing_ = true;
      sending_ = newest_;
    }
    StartWrite(&sending_);
  }

  void FinishOnce(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    membership_->RemoveListener(listener_);
    Finish(status);
  }

  Membership* const membership_;
  int64_t listener_ = 0;
  absl::Mutex mu_;
  v1::Topology newest_ ABSL_GUARDED_BY(mu_);
  uint64_t newest_version_ ABSL_GUARDED_BY(mu_) = 0;
  // Owned by the write in flight while writing_.
  v1::Topology sending_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerUnaryReactor* ControllerService::Register(grpc::CallbackServerContext* context,
                                                      const v1::RegisterRequest* request,
                                                      v1::RegisterResponse* response) {
  absl::StatusOr<v1::RegisterResponse> registered = membership_->Register(*request);
  if (!registered.ok()) return FinishUnary(context, registered.status());
  *response = std::move(*registered);
  const bool worker = request->has_worker();
  TRIDENT_LOG(INFO) << "registered " << (worker ? "worker " : "attention service ")
                    << (worker ? request->worker().worker_id()
                               : request->attention().service_id())
                    << " at "
                    << (worker ? request->worker().address() : request->attention().address())
                    << (worker ? absl::StrCat(" as ", RoleName(request->worker().role())) : "");
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>*
ControllerService::Heartbeat(grpc::CallbackServerContext* context) {
  return new HeartbeatReactor(membership_);
}

grpc::ServerUnaryReactor* ControllerService::Deregister(grpc::CallbackServerContext* context,
                                                        const v1::DeregisterRequest* request,
                                                        v1::DeregisterResponse* response) {
  absl::Status status = membership_->Deregister(*request);
  if (status.ok()) {
    TRIDENT_LOG(INFO) << "deregistered " << request->member_id()
                      << (request->reason().empty() ? "" : ": ") << request->reason();
  }
  return FinishUnary(context, status);
}

grpc::ServerUnaryReactor* ControllerService::GetTopology(grpc::CallbackServerContext* context,
                                                         const v1::GetTopologyRequest* request,
                                                         v1::Topology* response) {
  *response = membership_->Snapshot();
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::Topology>* ControllerService::WatchTopology(
    grpc::CallbackServerContext* context, const v1::WatchTopologyRequest* request) {
  return new WatchReactor(membership_, *request);
}

grpc::ServerUnaryReactor* ControllerService::GetStatus(
    grpc::CallbackServerContext* context, const v1::GetControllerStatusRequest* request,
    v1::ControllerStatus* response) {
  if (request->max_decisions() < 0 || request->max_decisions() > kMaxStatusDecisions) {
    return FinishUnary(context,
                       InvalidArgumentForField("max_decisions",
                                               absl::StrCat("must be in [0, ",
                                                            kMaxStatusDecisions, "]")));
  }
  if (balancer_ != nullptr) {
    *response = balancer_->Status(request->max_decisions());
  } else {
    response->set_controller_incarnation(membership_->options().controller_incarnation);
  }
  return FinishUnary(context, absl::OkStatus());
}

}  // namespace trident::controller
