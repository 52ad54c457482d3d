#include "common/controller_client/controller_member.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/controller_client/channel.h"
#include "common/grpc/status.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"
#include "common/time/proto_time.h"

namespace trident::controller_client {

namespace v1 = ::trident::v1;

namespace {

// The shortest heartbeat interval honoured, whatever a controller answers:
// a member never spins.
constexpr absl::Duration kMinHeartbeatInterval = absl::Milliseconds(1);

// State of one Heartbeat call shared by the member's thread and the
// reactor's reactions, guarded by the member's mutex. It lives on the
// member thread's stack until the reactor's OnDone has run.
struct HeartbeatStreamState {
  // A write is outstanding; `request` is not touched until it completes.
  bool writing = false;
  absl::Time write_started;
  trident::v1::HeartbeatRequest request;
  // A read or write failed: the call is over or ending.
  bool ended = false;
  // OnDone ran; `final_status` is the call's status.
  bool done = false;
  grpc::Status final_status;
};

}  // namespace

// One Heartbeat call. Holds a hold (AddHold) from Begin until Release, so
// that OnDone cannot run, and the reactor cannot be deleted, while the
// member's thread may still call Write or Cancel. Deletes itself in OnDone.
class ControllerMember::HeartbeatReactor final
    : public grpc::ClientBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
 public:
  HeartbeatReactor(ControllerMember* member, HeartbeatStreamState* state)
      : member_(member), state_(state) {}

  void Begin() {
    member_->stub_->async()->Heartbeat(&context_, this);
    AddHold();
    StartRead(&response_);
    StartCall();
  }
  // REQUIRES: the caller set state_->writing, and `request` stays untouched
  // until OnWriteDone.
  void Write(const v1::HeartbeatRequest* request) { StartWrite(request); }
  void Cancel() { context_.TryCancel(); }
  // After this the member's thread must not touch the reactor.
  void Release() { RemoveHold(); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock lock(&member_->mu_);
      state_->ended = true;
      return;
    }
    {
      absl::MutexLock lock(&member_->mu_);
      ++member_->status_.responses_received;
    }
    member_->HandleResponse(response_);
    StartRead(&response_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&member_->mu_);
    state_->writing = false;
    if (ok) {
      ++member_->status_.heartbeats_sent;
      member_->status_.heartbeating = true;
    } else {
      state_->ended = true;
    }
  }

  void OnDone(const grpc::Status& status) override {
    {
      absl::MutexLock lock(&member_->mu_);
      state_->done = true;
      state_->final_status = status;
    }
    delete this;
  }

 private:
  ControllerMember* const member_;
  HeartbeatStreamState* const state_;
  grpc::ClientContext context_;
  v1::HeartbeatResponse response_;
};

absl::Status MemberIdentity(const v1::RegisterRequest& request, std::string* member_id,
                            uint64_t* incarnation) {
  switch (request.member_case()) {
    case v1::RegisterRequest::kWorker:
      *member_id = request.worker().worker_id();
      *incarnation = request.worker().incarnation();
      break;
    case v1::RegisterRequest::kAttention:
      *member_id = request.attention().service_id();
      *incarnation = request.attention().incarnation();
      break;
    case v1::RegisterRequest::MEMBER_NOT_SET:
      return absl::InvalidArgumentError("RegisterRequest.member: neither worker nor attention set");
  }
  if (member_id->empty()) {
    return absl::InvalidArgumentError("RegisterRequest: the member's id is empty");
  }
  if (*incarnation == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterRequest: member ", *member_id, " has incarnation 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ControllerMember>> ControllerMember::Create(
    ControllerMemberOptions options) {
  if (options.controller_address.empty()) {
    return absl::InvalidArgumentError("ControllerMemberOptions.controller_address is empty");
  }
  if (!options.build_registration) {
    return absl::InvalidArgumentError("ControllerMemberOptions.build_registration is not set");
  }
  return std::unique_ptr<ControllerMember>(new ControllerMember(std::move(options)));
}

ControllerMember::ControllerMember(ControllerMemberOptions options)
    : options_(std::move(options)),
      stub_(v1::Controller::NewStub(
          ControllerChannel(options_.controller_address, options_.backoff))) {}

ControllerMember::~ControllerMember() { Stop(); }

void ControllerMember::Start() {
  absl::MutexLock lock(&mu_);
  if (started_ || stopping_) return;
  started_ = true;
  thread_ = std::thread([this] { Run(); });
}

void ControllerMember::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      // Another caller is stopping it: wait for that to finish.
      mu_.Await(absl::Condition(&stopped_));
      return;
    }
    stopping_ = true;
    if (register_context_ != nullptr) register_context_->TryCancel();
  }
  // The thread sees stopping_ and cancels its heartbeat stream itself.
  if (thread_.joinable()) thread_.join();
  std::unique_ptr<Registration> registration;
  {
    absl::MutexLock lock(&mu_);
    if (status_.registered) registration = std::move(registration_);
  }
  if (registration != nullptr) Deregister(*registration);
  absl::MutexLock lock(&mu_);
  status_.registered = false;
  status_.heartbeating = false;
  stopped_ = true;
}

ControllerMemberStatus ControllerMember::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

bool ControllerMember::Await(const std::function<bool(const ControllerMemberStatus&)>& condition,
                             absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto holds = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return condition(status_); };
  return mu_.AwaitWithTimeout(absl::Condition(&holds), timeout);
}

void ControllerMember::Run() {
  Backoff backoff(options_.backoff, options_.seed);
  std::optional<Registration> registration;
  while (true) {
    if (!registration.has_value()) {
      absl::StatusOr<Registration> registered = Register();
      if (registered.ok()) {
        registration = *std::move(registered);
        backoff.Reset();
      } else {
        {
          absl::MutexLock lock(&mu_);
          if (stopping_) return;
          ++status_.failed_registrations;
          RecordError(registered.status());
        }
        if (!SleepUnlessStopping(backoff.Next())) return;
        continue;
      }
    }
    const StreamEnd end = RunHeartbeatStream(*registration);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      RecordError(end.status);
      if (absl::IsNotFound(end.status)) {
        // The controller no longer knows us (it restarted, or expired us):
        // register again before the next stream.
        status_.registered = false;
        registration_.reset();
      }
    }
    if (absl::IsNotFound(end.status)) registration.reset();
    if (end.healthy) backoff.Reset();
    if (!SleepUnlessStopping(backoff.Next())) return;
  }
}

absl::StatusOr<ControllerMember::Registration> ControllerMember::Register() {
  const v1::RegisterRequest request = options_.build_registration();
  Registration registration;
  TRIDENT_RETURN_IF_ERROR(
      MemberIdentity(request, &registration.member_id, &registration.incarnation));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.register_timeout));
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("stopping");
    register_context_ = &context;
  }
  v1::RegisterResponse response;
  const grpc::Status status = stub_->Register(&context, request, &response);
  {
    absl::MutexLock lock(&mu_);
    register_context_ = nullptr;
  }
  if (!status.ok()) {
    const absl::Status error = FromGrpcStatus(status);
    return absl::Status(error.code(), absl::StrCat("Register at ", options_.controller_address,
                                                   ": ", error.message()));
  }
  const absl::Duration asked = DurationFromProto(response.heartbeat_interval());
  registration.interval = asked > absl::ZeroDuration() ? std::max(asked, kMinHeartbeatInterval)
                                                       : options_.default_heartbeat_interval;
  registration.stall_timeout =
      std::max(options_.stalled_write_timeout, DurationFromProto(response.dead_after()));
  {
    absl::MutexLock lock(&mu_);
    if (status_.registrations > 0 &&
        response.controller_incarnation() != status_.controller_incarnation) {
      ++status_.controller_restarts;
      TRIDENT_LOG(INFO) << "the controller at " << options_.controller_address
                        << " restarted (incarnation " << status_.controller_incarnation << " -> "
                        << response.controller_incarnation() << ")";
    }
    status_.registered = true;
    status_.controller_incarnation = response.controller_incarnation();
    ++status_.registrations;
    status_.heartbeat_interval = registration.interval;
    registration_ = std::make_unique<Registration>(registration);
    last_logged_error_.clear();
  }
  TRIDENT_LOG(INFO) << "registered " << registration.member_id << " (incarnation "
                    << registration.incarnation << ") with the controller at "
                    << options_.controller_address << " (incarnation "
                    << response.controller_incarnation() << "); heartbeat every "
                    << registration.interval;
  if (response.has_directive()) {
    v1::HeartbeatResponse directive;
    *directive.mutable_set_role() = response.directive();
    HandleResponse(directive);
  }
  return registration;
}

ControllerMember::StreamEnd ControllerMember::RunHeartbeatStream(const Registration& registration) {
  HeartbeatStreamState state;
  auto* reactor = new HeartbeatReactor(this, &state);
  const absl::Time opened = absl::Now();
  reactor->Begin();
  absl::Time next = opened;
  bool stalled = false;
  bool cancel = false;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto over = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || state.ended; };
      const absl::Time deadline =
          state.writing ? std::min(next, state.write_started + registration.stall_timeout) : next;
      mu_.AwaitWithDeadline(absl::Condition(&over), deadline);
      if (stopping_ || state.ended) {
        cancel = stopping_;
        break;
      }
      const absl::Time now = absl::Now();
      if (state.writing && now - state.write_started >= registration.stall_timeout) {
        stalled = cancel = true;
        break;
      }
      if (now < next) continue;
      next = std::max(next + registration.interval, now);
      // A heartbeat still going out when the next is due: skip this one
      // rather than queue (the next carries fresher load anyway).
      if (state.writing) continue;
      state.writing = true;
      state.write_started = now;
    }
    // Only this thread touches `state.request` while `writing` is set and
    // no write is started.
    state.request.Clear();
    if (options_.fill_heartbeat) {
      options_.fill_heartbeat(&state.request);
    } else {
      state.request.set_state(v1::SERVING_STATE_SERVING);
    }
    state.request.set_member_id(registration.member_id);
    state.request.set_incarnation(registration.incarnation);
    reactor->Write(&state.request);
  }
  if (cancel) reactor->Cancel();
  reactor->Release();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&state.done));
  status_.heartbeating = false;
  StreamEnd end;
  end.healthy = absl::Now() - opened >= 2 * registration.interval;
  if (stalled) {
    end.status = absl::DeadlineExceededError(absl::StrCat(
        "Heartbeat to ", options_.controller_address, ": a heartbeat was not sent within ",
        absl::FormatDuration(registration.stall_timeout), "; reconnecting"));
  } else {
    const absl::Status error = FromGrpcStatus(state.final_status);
    end.status =
        error.ok() ? absl::UnavailableError("the controller ended the heartbeat stream") : error;
    end.status = absl::Status(
        end.status.code(),
        absl::StrCat("Heartbeat to ", options_.controller_address, ": ", end.status.message()));
  }
  return end;
}

void ControllerMember::HandleResponse(const v1::HeartbeatResponse& response) {
  if (options_.on_response) {
    options_.on_response(response);
    return;
  }
  if (response.has_set_role()) {
    TRIDENT_LOG(INFO) << "controller directive " << response.set_role().directive_id()
                      << " (set role " << v1::Role_Name(response.set_role().role()) << ": "
                      << response.set_role().reason()
                      << ") ignored: directives on heartbeats are not applied; the controller "
                         "uses WorkerControl.SetRole";
  }
}

bool ControllerMember::SleepUnlessStopping(absl::Duration delay) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), delay);
  return !stopping_;
}

void ControllerMember::Deregister(const Registration& registration) {
  v1::DeregisterRequest request;
  request.set_member_id(registration.member_id);
  request.set_incarnation(registration.incarnation);
  request.set_reason(options_.deregister_reason);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.deregister_timeout));
  v1::DeregisterResponse response;
  const grpc::Status status = stub_->Deregister(&context, request, &response);
  absl::MutexLock lock(&mu_);
  if (status.ok()) {
    status_.deregistered = true;
    TRIDENT_LOG(INFO) << "deregistered " << registration.member_id << " from the controller at "
                      << options_.controller_address;
    return;
  }
  const absl::Status error = FromGrpcStatus(status);
  RecordError(absl::Status(error.code(), absl::StrCat("Deregister at ", options_.controller_address,
                                                      ": ", error.message())),
              /*retrying=*/false);
}

void ControllerMember::RecordError(const absl::Status& error, bool retrying) {
  status_.last_error = error;
  // A retry loop meets the same error again and again: log each new one.
  std::string text = error.ToString();
  if (text == last_logged_error_) return;
  TRIDENT_LOG(WARNING) << text << (retrying ? " (retrying with backoff)" : "");
  last_logged_error_ = std::move(text);
}

}  // namespace trident::controller_client
