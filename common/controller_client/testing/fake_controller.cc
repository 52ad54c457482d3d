#include "common/controller_client/testing/fake_controller.h"

#include <chrono>
#include <deque>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/controller_client/controller_member.h"
#include "common/controller_client/member_requests.h"
#include "common/grpc/reactors.h"
#include "common/grpc/status.h"
#include "common/time/proto_time.h"

namespace trident::controller_client {

namespace v1 = ::trident::v1;

const FakeMemberRecord& FakeControllerState::Member(const std::string& member_id) const {
  static const FakeMemberRecord* const kNone = new FakeMemberRecord();
  auto it = members.find(member_id);
  return it == members.end() ? *kNone : it->second;
}

// One Heartbeat call: each message is checked against the membership;
// the first one that fails ends the call with its status.
class FakeController::HeartbeatStream final
    : public grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
 public:
  explicit HeartbeatStream(FakeController* controller) : controller_(controller) {
    absl::MutexLock lock(&controller_->mu_);
    controller_->heartbeat_streams_.insert(this);
    ++controller_->state_.open_heartbeat_streams;
    StartRead(&request_);
  }

  const std::string& member_id() const { return member_id_; }

  // Queues `response`; false once the call is finishing.
  bool SendLocked(const v1::HeartbeatResponse& response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(controller_->mu_) {
    if (finishing_) return false;
    outbox_.push_back(response);
    PumpLocked();
    return true;
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(controller_->mu_) {
    if (finishing_) return;
    finishing_ = true;
    final_ = status;
    PumpLocked();
  }

  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&controller_->mu_);
    if (!ok) {
      FinishLocked(grpc::Status::OK);
      return;
    }
    if (finishing_) return;
    member_id_ = request_.member_id();
    const absl::Status status = controller_->HeartbeatLocked(request_);
    if (!status.ok()) {
      FinishLocked(ToGrpcStatus(status));
      return;
    }
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&controller_->mu_);
    writing_ = false;
    outbox_.pop_front();
    if (!ok) FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
    PumpLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&controller_->mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&controller_->mu_);
      controller_->heartbeat_streams_.erase(this);
      --controller_->state_.open_heartbeat_streams;
    }
    delete this;
  }

 private:
  // One write at a time; Finish once no write is outstanding.
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(controller_->mu_) {
    if (writing_ || finished_) return;
    if (finishing_) {
      finished_ = true;
      Finish(final_);
      return;
    }
    if (outbox_.empty()) return;
    writing_ = true;
    StartWrite(&outbox_.front());
  }

  FakeController* const controller_;
  v1::HeartbeatRequest request_;
  std::string member_id_;
  std::deque<v1::HeartbeatResponse> outbox_;
  bool writing_ = false;
  bool finishing_ = false;
  bool finished_ = false;
  grpc::Status final_;
};

// One WatchTopology call: the current topology at once (unless the caller
// has it), then the latest after each change; versions published while a
// write is outstanding collapse into the newest.
class FakeController::WatchStream final : public grpc::ServerWriteReactor<v1::Topology> {
 public:
  WatchStream(FakeController* controller, const v1::WatchTopologyRequest& request)
      : controller_(controller) {
    absl::MutexLock lock(&controller_->mu_);
    controller_->watch_streams_.insert(this);
    ++controller_->state_.open_watch_streams;
    ++controller_->state_.watch_calls;
    controller_->state_.last_watch_request = request;
    // Watchers learn that the stream is up even when the first message is
    // skipped.
    StartSendInitialMetadata();
    const v1::Topology& topology = controller_->state_.topology;
    if (request.known_controller_incarnation() != topology.controller_incarnation() ||
        request.known_version() != topology.version()) {
      OfferLocked(topology);
    }
  }

  void OfferLocked(const v1::Topology& topology) ABSL_EXCLUSIVE_LOCKS_REQUIRED(controller_->mu_) {
    pending_ = topology;
    has_pending_ = true;
    PumpLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&controller_->mu_);
    writing_ = false;
    if (!ok) finishing_ = true;
    PumpLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&controller_->mu_);
    finishing_ = true;
    PumpLocked();
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&controller_->mu_);
      controller_->watch_streams_.erase(this);
      --controller_->state_.open_watch_streams;
    }
    delete this;
  }

 private:
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(controller_->mu_) {
    if (writing_ || finished_) return;
    if (finishing_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      return;
    }
    if (!has_pending_) return;
    current_ = std::move(pending_);
    has_pending_ = false;
    writing_ = true;
    StartWrite(&current_);
  }

  FakeController* const controller_;
  v1::Topology pending_;
  bool has_pending_ = false;
  v1::Topology current_;
  bool writing_ = false;
  bool finishing_ = false;
  bool finished_ = false;
};

FakeController::FakeController(FakeControllerOptions options) : options_(options) {
  state_.topology.set_controller_incarnation(options_.controller_incarnation);
  state_.topology.set_version(1);
  SetProtoTimestamp(absl::Now(), state_.topology.mutable_update_time());
}

FakeController::~FakeController() = default;

grpc::ServerUnaryReactor* FakeController::Register(grpc::CallbackServerContext* context,
                                                   const v1::RegisterRequest* request,
                                                   v1::RegisterResponse* response) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    status = RegisterLocked(*request);
  }
  if (status.ok()) {
    SetProtoDuration(options_.heartbeat_interval, response->mutable_heartbeat_interval());
    SetProtoDuration(options_.dead_after, response->mutable_dead_after());
    response->set_controller_incarnation(options_.controller_incarnation);
  }
  return FinishUnary(context, status);
}

grpc::ServerBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse>* FakeController::Heartbeat(
    grpc::CallbackServerContext* context) {
  return new HeartbeatStream(this);
}

grpc::ServerUnaryReactor* FakeController::Deregister(grpc::CallbackServerContext* context,
                                                     const v1::DeregisterRequest* request,
                                                     v1::DeregisterResponse* response) {
  absl::MutexLock lock(&mu_);
  return FinishUnary(context, DeregisterLocked(*request));
}

grpc::ServerUnaryReactor* FakeController::GetTopology(grpc::CallbackServerContext* context,
                                                      const v1::GetTopologyRequest* request,
                                                      v1::Topology* response) {
  {
    absl::MutexLock lock(&mu_);
    *response = state_.topology;
  }
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::Topology>* FakeController::WatchTopology(
    grpc::CallbackServerContext* context, const v1::WatchTopologyRequest* request) {
  return new WatchStream(this, *request);
}

absl::Status FakeController::AddMember(const v1::RegisterRequest& request) {
  absl::MutexLock lock(&mu_);
  return RegisterLocked(request);
}

void FakeController::Forget(const std::string& member_id) {
  absl::MutexLock lock(&mu_);
  auto it = state_.members.find(member_id);
  if (it != state_.members.end()) it->second.registered = false;
  RemoveEntryLocked(member_id);
  PublishLocked();
  for (HeartbeatStream* stream : heartbeat_streams_) {
    if (stream->member_id() == member_id) {
      stream->FinishLocked(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                        absl::StrCat("member ", member_id, " is not registered")));
    }
  }
}

absl::Status FakeController::SetWorkerState(const std::string& worker_id, v1::ServingState state) {
  absl::MutexLock lock(&mu_);
  for (v1::WorkerEntry& entry : *state_.topology.mutable_workers()) {
    if (entry.registration().worker_id() != worker_id) continue;
    entry.set_state(state);
    PublishLocked();
    return absl::OkStatus();
  }
  return absl::NotFoundError(absl::StrCat("worker ", worker_id, " is not registered"));
}

int FakeController::SendToMember(const std::string& member_id,
                                 const v1::HeartbeatResponse& response) {
  absl::MutexLock lock(&mu_);
  int sent = 0;
  for (HeartbeatStream* stream : heartbeat_streams_) {
    if (stream->member_id() == member_id && stream->SendLocked(response)) ++sent;
  }
  return sent;
}

FakeControllerState FakeController::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

bool FakeController::Await(const std::function<bool(const FakeControllerState&)>& condition,
                           absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto holds = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return condition(state_); };
  return mu_.AwaitWithTimeout(absl::Condition(&holds), timeout);
}

absl::Status FakeController::RegisterLocked(const v1::RegisterRequest& request) {
  std::string id;
  uint64_t incarnation = 0;
  if (absl::Status valid = ValidateRegisterRequest(request); !valid.ok()) return valid;
  if (absl::Status valid = MemberIdentity(request, &id, &incarnation); !valid.ok()) return valid;
  // Another incarnation, older or newer, replaces the entry (as the
  // controller does: a member that restarted with a lower number is still
  // the one that registers now).
  FakeMemberRecord& record = state_.members[id];
  const bool changed = !record.registered || incarnation != record.incarnation;
  record.registered = true;
  record.incarnation = incarnation;
  ++record.registrations;
  record.last_registration = request;
  if (!changed) return absl::OkStatus();
  RemoveEntryLocked(id);
  const absl::Time now = absl::Now();
  if (request.has_worker()) {
    v1::WorkerEntry* entry = state_.topology.add_workers();
    *entry->mutable_registration() = request.worker();
    entry->set_role(request.worker().role());
    entry->set_state(v1::SERVING_STATE_SERVING);
    SetProtoTimestamp(now, entry->mutable_register_time());
  } else {
    v1::AttentionServiceEntry* entry = state_.topology.add_attention_services();
    *entry->mutable_registration() = request.attention();
    entry->set_state(v1::SERVING_STATE_SERVING);
    SetProtoTimestamp(now, entry->mutable_register_time());
  }
  PublishLocked();
  return absl::OkStatus();
}

absl::Status FakeController::HeartbeatLocked(const v1::HeartbeatRequest& request) {
  if (absl::Status valid = ValidateHeartbeatState(request.state()); !valid.ok()) return valid;
  if (absl::Status known = CheckIncarnationLocked(request.member_id(), request.incarnation());
      !known.ok()) {
    return known;
  }
  FakeMemberRecord& record = state_.members[request.member_id()];
  if (absl::Status valid = ValidateHeartbeatLoad(request, record.last_registration.has_worker());
      !valid.ok()) {
    return valid;
  }
  ++record.heartbeats;
  record.heartbeat_times.push_back(absl::Now());
  record.last_heartbeat = request;
  for (v1::WorkerEntry& entry : *state_.topology.mutable_workers()) {
    if (entry.registration().worker_id() != request.member_id()) continue;
    const bool changed =
        (request.state() != v1::SERVING_STATE_UNSPECIFIED && request.state() != entry.state()) ||
        (request.has_worker_load() && request.worker_load().role() != v1::ROLE_UNSPECIFIED &&
         request.worker_load().role() != entry.role());
    if (!changed) break;
    if (request.state() != v1::SERVING_STATE_UNSPECIFIED) entry.set_state(request.state());
    if (request.worker_load().role() != v1::ROLE_UNSPECIFIED) {
      entry.set_role(request.worker_load().role());
    }
    PublishLocked();
    break;
  }
  return absl::OkStatus();
}

absl::Status FakeController::CheckIncarnationLocked(const std::string& member_id,
                                                    uint64_t incarnation) const {
  const auto it = state_.members.find(member_id);
  const bool registered = it != state_.members.end() && it->second.registered;
  return CheckMemberIncarnation(member_id, registered, registered ? it->second.incarnation : 0,
                                incarnation, options_.controller_incarnation);
}

absl::Status FakeController::DeregisterLocked(const v1::DeregisterRequest& request) {
  if (absl::Status known = CheckIncarnationLocked(request.member_id(), request.incarnation());
      !known.ok()) {
    return known;
  }
  FakeMemberRecord& record = state_.members[request.member_id()];
  record.registered = false;
  ++record.deregistrations;
  RemoveEntryLocked(request.member_id());
  PublishLocked();
  return absl::OkStatus();
}

void FakeController::RemoveEntryLocked(const std::string& member_id) {
  auto* workers = state_.topology.mutable_workers();
  for (int i = 0; i < workers->size(); ++i) {
    if (workers->Get(i).registration().worker_id() == member_id) {
      workers->DeleteSubrange(i, 1);
      return;
    }
  }
  auto* services = state_.topology.mutable_attention_services();
  for (int i = 0; i < services->size(); ++i) {
    if (services->Get(i).registration().service_id() == member_id) {
      services->DeleteSubrange(i, 1);
      return;
    }
  }
}

void FakeController::PublishLocked() {
  state_.topology.set_version(state_.topology.version() + 1);
  SetProtoTimestamp(absl::Now(), state_.topology.mutable_update_time());
  for (WatchStream* stream : watch_streams_) stream->OfferLocked(state_.topology);
}

absl::StatusOr<std::unique_ptr<FakeControllerServer>> FakeControllerServer::Start(
    FakeControllerOptions options, int port) {
  auto controller = std::make_unique<FakeController>(options);
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                           &bound);
  builder.RegisterService(controller.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve on 127.0.0.1:", port));
  }
  return std::unique_ptr<FakeControllerServer>(
      new FakeControllerServer(std::move(controller), std::move(server), bound));
}

FakeControllerServer::FakeControllerServer(std::unique_ptr<FakeController> controller,
                                           std::unique_ptr<grpc::Server> server, int port)
    : controller_(std::move(controller)), server_(std::move(server)), port_(port) {}

FakeControllerServer::~FakeControllerServer() {
  Shutdown();
  server_.reset();
  controller_.reset();
}

void FakeControllerServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  // A deadline of now cancels the open streams at once; Shutdown returns
  // once every call has ended.
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
}

std::string FakeControllerServer::address() const { return absl::StrCat("127.0.0.1:", port_); }

}  // namespace trident::controller_client
