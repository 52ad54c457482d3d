#include "services/worker/decode_service.h"

#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/fault/fault_points.h"
#include "common/frontend/request_proto.h"
#include "common/grpc/reactors.h"
#include "common/grpc/stream_channel.h"
#include "common/logging/log.h"
#include "common/sampling/sampling_params.h"
#include "common/status/error_details.h"
#include "common/status/status_macros.h"
#include "common/time/proto_time.h"

namespace trident::worker {
namespace {

namespace v1 = ::trident::v1;

// A lease from a request: unset means the default; (0, max] else
// INVALID_ARGUMENT naming `field` (longer is capped by KvReservations).
absl::StatusOr<absl::Duration> LeaseFrom(bool has, const google::protobuf::Duration& d,
                                         absl::string_view field) {
  if (!has) return absl::ZeroDuration();
  const absl::Duration lease = DurationFromProto(d);
  if (lease <= absl::ZeroDuration()) {
    return InvalidArgumentForField(
        field, absl::StrCat("must be positive, got ", absl::FormatDuration(lease)));
  }
  return lease;
}

// The state of one Decode call, shared by the reactor's hooks, the
// reservation's hand-off callback and the engine's token callback.
struct DecodeCall {
  std::shared_ptr<StreamChannel<v1::DecodeResponse>> channel;
  engine::Engine* engine = nullptr;
  std::string request_id;
  int32_t prompt_tokens = 0;
  bool logprobs = false;
  std::atomic<int32_t> completion_tokens{0};
  // Prompt tokens the engine found cached (colocated prefill).
  std::atomic<int32_t> cached_tokens{0};
  std::atomic<bool> in_engine{false};
  // Admitted by the worker's role (or carried on from the reservation's
  // ReserveKv); ends with the call.
  WorkerRole::Work work;

  // Streams one engine event; the final one completes the call.
  void OnEvent(const engine::TokenEvent& ev) {
    if (ev.token >= 0 && ev.finish != engine::FinishReason::kAborted &&
        ev.finish != engine::FinishReason::kError) {
      if (absl::Status fault = fault::FaultPoint("decode.token"); !fault.ok()) {
        channel->Close(fault);
        return;
      }
      completion_tokens.fetch_add(1);
      if (ev.output_index == 0) cached_tokens.store(ev.cached_tokens);
      v1::DecodeResponse r;
      v1::TokenChunk* chunk = r.mutable_chunk();
      chunk->set_request_id(request_id);
      chunk->add_token_ids(ev.token);
      if (logprobs) {
        frontend::AppendLogprobs(ev, chunk);
      }
      channel->Push(std::move(r));
    }
    if (ev.finish == engine::FinishReason::kNone) return;
    if (ev.finish == engine::FinishReason::kError) {
      // The engine's reason (UNAVAILABLE when the sequence lost its
      // attention service: the router migrates it).
      channel->Close(ev.error.ok() ? absl::InternalError("the engine failed the sequence")
                                   : ev.error);
      return;
    }
    Complete(frontend::FinishReasonToProto(ev.finish),
             ev.finish == engine::FinishReason::kStop ? ev.matched_stop_token : -1,
             ev.placement.has_value() ? ev.placement->attention_service_id : "");
  }

  // `attention_service_id`: where its decode attention ran, if offloaded.
  void Complete(v1::FinishReason reason, int32_t stop_token,
                const std::string& attention_service_id = "") {
    v1::DecodeResponse r;
    v1::GenerateComplete* c = r.mutable_complete();
    c->set_request_id(request_id);
    if (!attention_service_id.empty()) {
      c->mutable_placement()->set_attention_service_id(attention_service_id);
    }
    c->set_finish_reason(reason);
    if (stop_token >= 0) c->set_stop_token_id(stop_token);
    c->mutable_usage()->set_prompt_tokens(prompt_tokens);
    c->mutable_usage()->set_completion_tokens(completion_tokens.load());
    c->mutable_usage()->set_cached_tokens(cached_tokens.load());
    channel->Push(std::move(r));
    channel->Close(absl::OkStatus());
  }
};

// The rest of a Decode call once its reservation's hand-off came: the
// sequence joins the engine (its blocks, or its placement at an attention
// service), or the call ends with the hand-off's outcome.
void JoinAfterHandOff(DecodeCall& call, engine::Engine* engine, absl::Duration waited,
                      const engine::EngineRequest& request, const engine::TokenCallback& on_token,
                      absl::StatusOr<KvHandOff> hand_off) {
  if (!hand_off.ok()) {
    call.channel->Close(hand_off.status());
    return;
  }
  if (call.channel->ended()) {
    // The client left while the KV arrived.
    if (!hand_off->blocks.empty()) (void)engine->FreeBlocks(hand_off->blocks);
    if (hand_off->remote.has_value() && hand_off->remote->release) hand_off->remote->release();
    return;
  }
  // The first token, sampled by the prefill worker, counts as output 0.
  call.completion_tokens.store(1);
  if (hand_off->commit.outcome == KvOutcome::kFinished) {
    const auto reason = static_cast<v1::FinishReason>(hand_off->commit.finish_reason);
    call.Complete(reason == v1::FINISH_REASON_UNSPECIFIED ? v1::FINISH_REASON_STOP : reason, -1);
    return;
  }
  v1::DecodeResponse joined;
  SetProtoDuration(waited, joined.mutable_joined()->mutable_waited());
  if (hand_off->remote.has_value()) {
    joined.mutable_joined()->set_cpu_resident(true);
    joined.mutable_joined()->set_attention_service_id(hand_off->remote->service_id);
  }
  call.channel->Push(std::move(joined));
  call.in_engine.store(true);
  if (hand_off->remote.has_value()) {
    // CPU-placed: the prompt's KV is at the attention service.
    RemotePlacement& remote = *hand_off->remote;
    absl::Status s = engine->SubmitPrefilledRemote(request, remote.kv, remote.service_id,
                                                   hand_off->commit.first_token, on_token);
    if (!s.ok()) {
      if (remote.release) remote.release();
      call.channel->Close(s);
    }
    return;
  }
  std::vector<int32_t> blocks = hand_off->blocks;
  absl::Status s = engine->SubmitPrefilled(request, std::move(hand_off->blocks),
                                           hand_off->commit.first_token, on_token);
  if (!s.ok()) {
    (void)engine->FreeBlocks(blocks);
    call.channel->Close(s);
  }
}

}  // namespace

DecodeService::DecodeService(engine::Engine* engine, const v1::ModelInfoResponse& model_info,
                             KvReservations* reservations, transport::KvReceiver* receiver,
                             const Clock* clock, DecodeServiceOptions options)
    : engine_(engine),
      model_info_(model_info),
      reservations_(reservations),
      receiver_(receiver),
      clock_(clock),
      options_(std::move(options)),
      own_role_(options_.worker_role == nullptr ? std::make_unique<WorkerRole>(options_.role, clock)
                                                : nullptr),
      role_(options_.worker_role != nullptr ? options_.worker_role : own_role_.get()) {
  lease_checker_ = std::thread([this] {
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    while (!mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.lease_check_interval)) {
      mu_.Unlock();
      ExpireLeases();
      mu_.Lock();
    }
  });
}

void DecodeService::ExpireLeases() {
  reservations_->ExpireLeases();
  EndFinishedReservationWork();
}

DecodeService::~DecodeService() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  lease_checker_.join();
}

WorkerRole::Work DecodeService::TakeReservationWork(uint64_t id) {
  absl::MutexLock lock(&work_mu_);
  auto it = reservation_work_.find(id);
  if (it == reservation_work_.end()) return WorkerRole::Work();
  WorkerRole::Work work = std::move(it->second);
  reservation_work_.erase(it);
  return work;
}

void DecodeService::EndFinishedReservationWork() {
  std::vector<WorkerRole::Work> ended;  // Ended outside the lock.
  absl::MutexLock lock(&work_mu_);
  for (auto it = reservation_work_.begin(); it != reservation_work_.end();) {
    if (reservations_->IsPending(it->first)) {
      ++it;
      continue;
    }
    ended.push_back(std::move(it->second));
    reservation_work_.erase(it++);
  }
}

absl::Status DecodeService::CheckIncarnation(uint64_t incarnation) const {
  if (incarnation != options_.incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("decode_incarnation ", incarnation, " is not this worker's (",
                     options_.incarnation, "): the worker restarted"));
  }
  return absl::OkStatus();
}

// One ReserveKv call between its checks and its answer, which may wait for
// an attention service's admission.
struct DecodeService::ReserveCall {
  grpc::ServerUnaryReactor* reactor = nullptr;
  const v1::ReserveKvRequest* request = nullptr;
  v1::ReserveKvResponse* response = nullptr;
  WorkerRole::Work work;
  absl::Duration lease;
  // The sequence's longest context, and whether it may go to an attention
  // service.
  int32_t max_total = 0;
  bool may_place = false;
};

grpc::ServerUnaryReactor* DecodeService::ReserveKv(grpc::CallbackServerContext* context,
                                                   const v1::ReserveKvRequest* request,
                                                   v1::ReserveKvResponse* response) {
  auto call = std::make_unique<ReserveCall>();
  call->reactor = context->DefaultReactor();
  call->request = request;
  call->response = response;
  if (absl::Status checked = CheckReserve(*call); !checked.ok()) {
    call->reactor->Finish(ToGrpcStatus(checked));
    return call->reactor;
  }
  grpc::ServerUnaryReactor* reactor = call->reactor;
  if (call->may_place && options_.placer->PlacesOnCpu(call->max_total)) {
    // Long enough for the CPU: placed there unless the services refuse,
    // then in this worker's blocks.
    PlaceAtService(std::move(call), /*if_refused=*/std::nullopt);
  } else {
    ReserveInBlocks(std::move(call), /*place_if_full=*/true);
  }
  return reactor;
}

absl::Status DecodeService::CheckReserve(ReserveCall& call) {
  const v1::ReserveKvRequest& request = *call.request;
  TRIDENT_ASSIGN_OR_RETURN(call.work, role_->Admit(Capability::kDecode, request.request_id()));
  if (receiver_ == nullptr) {
    return absl::FailedPreconditionError(
        "this worker has no KV transport: it cannot receive a prefill worker's KV");
  }
  if (request.request_id().empty()) {
    return InvalidArgumentForField("request_id", "must not be empty");
  }
  const int32_t max_context = model_info_.max_context_tokens();
  if (request.num_tokens() < 1 || request.num_tokens() > max_context - 1) {
    return InvalidArgumentForField("num_tokens", absl::StrCat("must be in [1, ", max_context - 1,
                                                              "], got ", request.num_tokens()));
  }
  if (request.max_total_tokens() != 0 && (request.max_total_tokens() < request.num_tokens() ||
                                          request.max_total_tokens() > max_context)) {
    return InvalidArgumentForField(
        "max_total_tokens", absl::StrCat("must be 0 or in [num_tokens, ", max_context, "], got ",
                                         request.max_total_tokens()));
  }
  if (request.prompt_token_ids_size() != 0 &&
      request.prompt_token_ids_size() != request.num_tokens()) {
    return InvalidArgumentForField(
        "prompt_token_ids", absl::StrCat("has ", request.prompt_token_ids_size(),
                                         " tokens but num_tokens is ", request.num_tokens()));
  }
  TRIDENT_RETURN_IF_ERROR(
      frontend::ValidatePromptTokenIds(request.prompt_token_ids(), model_info_.vocab_size()));
  TRIDENT_ASSIGN_OR_RETURN(call.lease, LeaseFrom(request.has_lease(), request.lease(), "lease"));
  call.max_total = request.max_total_tokens() != 0 ? request.max_total_tokens() : max_context;
  call.may_place = request.allow_cpu_attention() && options_.placer != nullptr;
  return absl::OkStatus();
}

void DecodeService::ReserveInBlocks(std::unique_ptr<ReserveCall> call, bool place_if_full) {
  const v1::ReserveKvRequest& request = *call->request;
  absl::StatusOr<KvReservations::Reservation> r =
      reservations_->Reserve(request.request_id(), request.num_tokens(), call->lease,
                             request.prompt_token_ids(), request.cache_salt());
  if (!r.ok()) {
    // The pool is full: an attention service may hold it instead.
    if (place_if_full && call->may_place && absl::IsResourceExhausted(r.status())) {
      PlaceAtService(std::move(call), /*if_refused=*/r.status());
      return;
    }
    FinishReserve(std::move(call), r.status());
    return;
  }
  if (absl::Status s = receiver_->Describe(call->response->mutable_destination()); !s.ok()) {
    reservations_->Release(r->id);
    FinishReserve(std::move(call), s);
    return;
  }
  FinishReserve(std::move(call), *std::move(r));
}

void DecodeService::PlaceAtService(std::unique_ptr<ReserveCall> call,
                                   std::optional<absl::Status> if_refused) {
  // Read before the callback takes `call` (arguments have no order).
  const v1::ReserveKvRequest& request = *call->request;
  const int32_t capacity = call->max_total;
  options_.placer->Place(
      request.request_id(), request.num_tokens(), capacity, request.prompt_token_ids(),
      request.cache_salt(),
      [this, call = std::move(call),
       if_refused = std::move(if_refused)](absl::StatusOr<PromptPlacement> placed) mutable {
        absl::StatusOr<KvReservations::Reservation> r =
            placed.ok() ? reservations_->ReserveRemote(call->request->request_id(),
                                                       std::move(placed->placement), call->lease)
                        : absl::StatusOr<KvReservations::Reservation>(placed.status());
        if (r.ok()) call->response->mutable_destination()->MergeFrom(placed->destination);
        if (r.ok()) {
          FinishReserve(std::move(call), *std::move(r));
        } else if (if_refused.has_value()) {
          // The blocks were full too: their answer stands.
          FinishReserve(std::move(call), *if_refused);
        } else {
          TRIDENT_LOG(WARNING) << "request " << call->request->request_id()
                               << " stays in this worker's KV blocks: " << r.status();
          ReserveInBlocks(std::move(call), /*place_if_full=*/false);
        }
      });
}

void DecodeService::FinishReserve(std::unique_ptr<ReserveCall> call,
                                  absl::StatusOr<KvReservations::Reservation> r) {
  if (!r.ok()) {
    call->reactor->Finish(ToGrpcStatus(r.status()));
    return;
  }
  // A role change that gives up waiting for it releases it.
  KvReservations* reservations = reservations_;
  call->work.SetAbortHook(
      [reservations, id = r->id](const absl::Status&) { reservations->Release(id); });
  {
    absl::MutexLock lock(&work_mu_);
    reservation_work_[r->id] = std::move(call->work);
  }
  v1::KvDestination* d = call->response->mutable_destination();
  d->set_decode_worker_id(options_.worker_id);
  d->set_decode_incarnation(options_.incarnation);
  d->set_decode_address(options_.address);
  d->set_reservation_id(r->id);
  d->set_num_tokens(call->request->num_tokens());
  // The writer fills only the blocks this worker's prefix cache lacks (a
  // placement's destination says what its service reads in place).
  if (!d->cpu_resident()) {
    d->set_num_cached_blocks(r->num_cached_blocks);
    for (size_t i = static_cast<size_t>(r->num_cached_blocks); i < r->blocks.size(); ++i) {
      d->add_block_ids(r->blocks[i]);
    }
  }
  SetProtoDuration(r->lease, d->mutable_lease_remaining());
  SetProtoTimestamp(r->expires, d->mutable_lease_expire_time());
  SetProtoDuration(r->lease, call->response->mutable_lease());
  call->reactor->Finish(grpc::Status::OK);
}

grpc::ServerUnaryReactor* DecodeService::RenewKv(grpc::CallbackServerContext* context,
                                                 const v1::RenewKvRequest* request,
                                                 v1::RenewKvResponse* response) {
  auto run = [&]() -> absl::Status {
    TRIDENT_RETURN_IF_ERROR(CheckIncarnation(request->decode_incarnation()));
    TRIDENT_ASSIGN_OR_RETURN(absl::Duration lease,
                             LeaseFrom(request->has_lease(), request->lease(), "lease"));
    TRIDENT_ASSIGN_OR_RETURN(absl::Time expires,
                             reservations_->Renew(request->reservation_id(), lease));
    SetProtoDuration(expires - clock_->Now(), response->mutable_lease_remaining());
    SetProtoTimestamp(expires, response->mutable_lease_expire_time());
    return absl::OkStatus();
  };
  return FinishUnary(context, run());
}

absl::StatusOr<KvCommit> DecodeService::CommitFrom(const v1::CommitKvRequest& request) const {
  TRIDENT_RETURN_IF_ERROR(CheckIncarnation(request.decode_incarnation()));
  KvCommit commit;
  switch (request.outcome()) {
    case v1::COMMIT_OUTCOME_COMPLETE:
      commit.outcome = KvOutcome::kComplete;
      break;
    case v1::COMMIT_OUTCOME_FINISHED:
      commit.outcome = KvOutcome::kFinished;
      commit.finish_reason = request.finish_reason();
      break;
    case v1::COMMIT_OUTCOME_ABORTED:
      commit.outcome = KvOutcome::kAborted;
      commit.error = request.error_message();
      break;
    default:
      return InvalidArgumentForField("outcome", "must be COMPLETE, FINISHED or ABORTED");
  }
  if (commit.outcome != KvOutcome::kAborted) {
    if (request.first_token().token_ids_size() != 1) {
      return InvalidArgumentForField("first_token.token_ids", "must hold exactly one token");
    }
    commit.first_token = request.first_token().token_ids(0);
    if (commit.first_token < 0 || commit.first_token >= model_info_.vocab_size()) {
      return InvalidArgumentForField(
          "first_token.token_ids[0]",
          absl::StrCat("token id ", commit.first_token, " is outside the vocabulary"));
    }
    if (request.first_token().logprobs_size() > 0) {
      commit.first_logprob = request.first_token().logprobs(0).logprob();
    }
  }
  return commit;
}

grpc::ServerUnaryReactor* DecodeService::CommitKv(grpc::CallbackServerContext* context,
                                                  const v1::CommitKvRequest* request,
                                                  v1::CommitKvResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<KvCommit> commit = CommitFrom(*request);
  if (!commit.ok()) {
    EndFinishedReservationWork();
    reactor->Finish(ToGrpcStatus(commit.status()));
    return reactor;
  }
  const uint64_t id = request->reservation_id();
  const bool await_bytes = commit->outcome == KvOutcome::kComplete && request->message_bytes() > 0;
  // Runs once the KV is in (at once unless it came as messages still being
  // copied in): never on this callback thread's account.
  auto finish = [this, reactor, id, commit = *std::move(commit)](absl::Status arrived) mutable {
    absl::Status committed;
    if (!arrived.ok()) {
      reservations_->Commit(id, {.outcome = KvOutcome::kAborted, .error = arrived.ToString()})
          .IgnoreError();
      committed = absl::DataLossError(absl::StrCat("KV transfer incomplete: ", arrived.message()));
    } else {
      committed = reservations_->Commit(id, std::move(commit));
    }
    EndFinishedReservationWork();
    reactor->Finish(ToGrpcStatus(committed));
  };
  if (await_bytes) {
    // The KV came as messages: the commit waits for the last of them to be
    // copied in, without holding this thread.
    reservations_->OnBytes(id, request->message_bytes(),
                           clock_->Now() + options_.message_arrival_timeout, std::move(finish));
  } else {
    finish(absl::OkStatus());
  }
  return reactor;
}

grpc::ServerUnaryReactor* DecodeService::ReleaseKv(grpc::CallbackServerContext* context,
                                                   const v1::ReleaseKvRequest* request,
                                                   v1::ReleaseKvResponse* response) {
  auto run = [&]() -> absl::Status {
    TRIDENT_RETURN_IF_ERROR(CheckIncarnation(request->decode_incarnation()));
    response->set_released(reservations_->Release(request->reservation_id()));
    return absl::OkStatus();
  };
  const absl::Status released = run();
  EndFinishedReservationWork();
  return FinishUnary(context, released);
}

grpc::ServerWriteReactor<v1::DecodeResponse>* DecodeService::Decode(
    grpc::CallbackServerContext* context, const v1::DecodeRequest* request) {
  auto call = std::make_shared<DecodeCall>();
  call->engine = engine_;
  call->request_id = request->request_id();
  const uint64_t reservation = request->reservation_id();
  KvReservations* reservations = reservations_;
  auto* reactor = new ChannelReactor<v1::DecodeResponse>(
      /*on_cancel=*/
      [call, reservation, reservations] {
        // Still waiting for the KV: give the reservation up; in the engine:
        // end the sequence there (its blocks are freed).
        if (call->in_engine.load()) {
          call->engine->Abort(call->request_id);
        } else if (reservation != 0) {
          reservations->Release(reservation);
        }
      },
      /*on_done=*/nullptr);
  call->channel = reactor->channel();

  // Validation and conversion to an engine request.
  // A role change that gives up waiting for the call ends it as a
  // cancellation does, telling the router why.
  std::weak_ptr<DecodeCall> weak = call;
  WorkerRole::AbortHook abort = [weak, reservation, reservations](const absl::Status& why) {
    std::shared_ptr<DecodeCall> c = weak.lock();
    if (c == nullptr) return;
    c->channel->Close(why);
    if (c->in_engine.load()) {
      c->engine->Abort(c->request_id);
    } else if (reservation != 0) {
      reservations->Release(reservation);
    }
  };
  auto prepare = [&]() -> absl::StatusOr<engine::EngineRequest> {
    if (reservation == 0) {
      // Colocated: the worker also computes the prompt (role both).
      TRIDENT_ASSIGN_OR_RETURN(call->work,
                               role_->Admit(Capability::kColocated, request->request_id(), abort));
    } else {
      TRIDENT_RETURN_IF_ERROR(CheckIncarnation(request->decode_incarnation()));
      // The reservation's work, admitted by ReserveKv, goes on in this call.
      call->work = TakeReservationWork(reservation);
      if (call->work.active()) {
        call->work.SetAbortHook(abort);
      } else {
        TRIDENT_ASSIGN_OR_RETURN(call->work,
                                 role_->Admit(Capability::kDecode, request->request_id(), abort));
      }
    }
    TRIDENT_ASSIGN_OR_RETURN(
        engine::EngineRequest er,
        frontend::EngineRequestFromProto(request->request_id(), request->prompt_token_ids(),
                                         request->sampling(), request->stop(), request->options(),
                                         model_info_, request->resumed_outputs()));
    er.cache_salt = request->cache_salt();
    return er;
  };
  absl::StatusOr<engine::EngineRequest> prepared = prepare();
  if (!prepared.ok()) {
    if (reservation != 0 && prepared.status().code() != absl::StatusCode::kFailedPrecondition) {
      reservations_->Release(reservation);
    }
    call->channel->Close(prepared.status());
    return reactor;
  }
  call->prompt_tokens = static_cast<int32_t>(prepared->prompt.size());
  call->logprobs = prepared->sampling.logprobs || prepared->sampling.top_logprobs > 0;
  engine::TokenCallback on_token = [call](const engine::TokenEvent& ev) { call->OnEvent(ev); };

  if (reservation == 0) {
    call->in_engine.store(true);
    if (absl::Status s = engine_->Submit(*std::move(prepared), on_token); !s.ok()) {
      call->channel->Close(s);
    }
    return reactor;
  }
  // Wait for the prefill side's hand-off, then continue in the engine.
  engine::Engine* engine = engine_;
  const Clock* clock = clock_;
  const absl::Time waiting_since = clock_->Now();
  auto request_for_engine = std::make_shared<engine::EngineRequest>(*std::move(prepared));
  reservations_->Await(reservation, [call, engine, clock, waiting_since, request_for_engine,
                                     on_token](absl::StatusOr<KvHandOff> hand_off) {
    JoinAfterHandOff(*call, engine, clock->Now() - waiting_since, *request_for_engine, on_token,
                     std::move(hand_off));
  });
  return reactor;
}

}  // namespace trident::worker
