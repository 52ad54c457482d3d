#include "services/router/remote_token_source.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/frontend/request_proto.h"
#include "common/grpc/status.h"
#include "common/logging/log.h"
#include "common/status/error_details.h"
#include "common/time/proto_time.h"

namespace trident::router {
namespace {

namespace v1 = ::trident::v1;

// The engine request's sampling and stop conditions as the workers' protos.
// Its stop tokens already include the model's EOS ids unless ignore_eos, so
// the workers are told to ignore EOS themselves.
void FillSampling(const engine::EngineRequest& r, v1::SamplingParams* s, v1::StopConditions* stop,
                  v1::OutputOptions* options) {
  s->set_max_tokens(r.max_tokens);
  s->set_temperature(r.sampling.temperature);
  s->set_top_p(r.sampling.top_p);
  s->set_top_k(r.sampling.top_k);
  s->set_min_p(r.sampling.min_p);
  s->set_seed(r.sampling.seed);
  s->set_repetition_penalty(r.sampling.repetition_penalty);
  s->set_presence_penalty(r.sampling.presence_penalty);
  s->set_frequency_penalty(r.sampling.frequency_penalty);
  for (int32_t t : r.stop_token_ids) stop->add_stop_token_ids(t);
  stop->set_ignore_eos(true);
  options->set_logprobs(r.sampling.logprobs || r.sampling.top_logprobs > 0);
  options->set_logprobs_top_n(r.sampling.top_logprobs);
}

engine::TokenEvent EventFrom(const std::string& id, const v1::TokenChunk& chunk, int i,
                             int32_t output_index) {
  engine::TokenEvent ev;
  ev.request_id = id;
  ev.token = chunk.token_ids(i);
  ev.output_index = output_index;
  if (i < chunk.logprobs_size()) {
    ev.logprob = chunk.logprobs(i).logprob();
    for (const v1::TopLogprob& top : chunk.logprobs(i).top_logprobs()) {
      ev.top_logprobs.emplace_back(top.token_id(), top.logprob());
    }
  }
  return ev;
}

// A worker's status as the client gets it: code and details (RetryInfo,
// BadRequest) kept, the message prefixed with the call and the worker.
absl::Status WorkerStatus(absl::string_view call, absl::string_view address,
                          const grpc::Status& status) {
  const absl::Status from = FromGrpcStatus(status);
  absl::Status out(from.code(), absl::StrCat(call, " on ", address, ": ", from.message()));
  from.ForEachPayload([&out](absl::string_view type_url, const absl::Cord& payload) {
    out.SetPayload(type_url, payload);
  });
  return out;
}

std::chrono::system_clock::time_point DeadlineIn(absl::Duration timeout) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout);
}

// Fire-and-forget Decode.ReleaseKv for a reservation nobody will use (the
// request was aborted between its reservation and its calls).
void ReleaseReservation(v1::Decode::Stub* stub, const v1::KvDestination& destination,
                        const std::string& why) {
  struct Call {
    grpc::ClientContext context;
    v1::ReleaseKvRequest request;
    v1::ReleaseKvResponse response;
  };
  auto* call = new Call;
  call->context.set_deadline(DeadlineIn(absl::Seconds(10)));
  call->request.set_decode_incarnation(destination.decode_incarnation());
  call->request.set_reservation_id(destination.reservation_id());
  call->request.set_reason(why);
  stub->async()->ReleaseKv(&call->context, &call->request, &call->response,
                           [call](grpc::Status) { delete call; });
}

}  // namespace

// One request. Its calls' callbacks run on gRPC's threads; `mu_` orders
// them. Owned by the source's `flights_` until both worker calls have
// ended (OnFlightDone), and kept alive by the callbacks in flight.
class RemoteTokenSource::Flight : public std::enable_shared_from_this<Flight> {
 public:
  // Where the request runs, as admission chose it.
  struct Route {
    admission::AdmissionId admission = 0;
    std::string prefill_id;
    std::string decode_id;
    std::string prefill_address;
    std::string decode_address;
    Stubs* prefill_stubs = nullptr;
    Stubs* decode_stubs = nullptr;
    absl::Duration predicted_ttft;
    absl::Duration predicted_tpot;
  };

  Flight(RemoteTokenSource* source, engine::EngineRequest request, engine::TokenCallback callback,
         absl::Time arrival)
      : source_(source),
        request_(std::move(request)),
        callback_(std::move(callback)),
        arrival_(arrival) {}

  const engine::EngineRequest& request() const { return request_; }
  absl::Time arrival() const { return arrival_; }

  admission::AdmissionRequest AdmissionAsk() const {
    admission::AdmissionRequest ask;
    ask.prompt_tokens = static_cast<int64_t>(request_.prompt.size());
    ask.max_output_tokens = request_.max_tokens;
    ask.qos_class = request_.qos_class;
    ask.ttft = request_.ttft_slo;
    ask.tpot = request_.tpot_slo;
    if (source_->options_.kv_index != nullptr) {
      kv_index::KvIndex::PrefixMatch match =
          source_->options_.kv_index->Match(request_.prompt, request_.cache_salt);
      ask.cached_tokens = std::move(match.gpu);
      ask.dram_cached_tokens = std::move(match.dram);
    }
    return ask;
  }

  // The latest a request that finds the KV cache full may still be given
  // room: its TTFT target under admission, its deadline, the source's cap.
  absl::Time WaitLimit(const admission::AdmissionDecision& decision) const {
    absl::Duration limit = source_->options_.max_kv_wait;
    if (decision.ttft_target.has_value()) limit = std::min(limit, *decision.ttft_target);
    if (request_.time_limit.has_value()) limit = std::min(limit, *request_.time_limit);
    return arrival_ + limit;
  }

  // Takes the route and asks its decode worker for a reservation; ends the
  // request instead if it was aborted meanwhile.
  void Reserve(Route route) ABSL_LOCKS_EXCLUDED(mu_);
  // The reservation's answer: the streams start, or the request waits for
  // KV room (returns false: the caller hands it to WaitForKv), or ends.
  bool OnReserved(const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // While the request waits for KV room.
  void SetWaiting(bool waiting) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a request that never (or no longer) has a call in flight: its
  // final event carries `status` (kError), or kAborted when it is OK;
  // `rejected`: counted as refused for that reason.
  void EndWithoutCalls(const absl::Status& status, absl::optional<admission::RejectReason> rejected)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels the calls in flight; the request then ends as aborted.
  void Abort() ABSL_LOCKS_EXCLUDED(mu_);
  bool aborted() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return aborted_;
  }

  // Waiting state, guarded by the source's mu_.
  absl::Time wait_limit = absl::InfiniteFuture();
  absl::Time next_try = absl::InfiniteFuture();
  absl::Duration retry_interval;

 private:
  class PrefillCall;
  class DecodeCall;
  enum class Call { kPrefill, kDecode };

  void StartStreams(const v1::KvDestination& destination) ABSL_LOCKS_EXCLUDED(mu_);
  void OnPrefillMessage(const v1::PrefillResponse& p) ABSL_LOCKS_EXCLUDED(mu_);
  void HandlePrefillLocked(const v1::PrefillResponse& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnDecodeMessage(v1::DecodeResponse d) ABSL_LOCKS_EXCLUDED(mu_);
  void HandleDecodeLocked(const v1::DecodeResponse& d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnCallDone(Call call, const grpc::Status& status) ABSL_LOCKS_EXCLUDED(mu_);
  // Emits the tokens of `chunk`.
  void EmitChunkLocked(const v1::TokenChunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Emits the final event from a worker's completion.
  void EmitCompleteLocked(const v1::GenerateComplete& complete) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues `ev` for the callback, which DeliverOutbox calls in order
  // without holding mu_ (the callback may call Abort, e.g. on a stop
  // string).
  void EmitLocked(engine::TokenEvent ev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Delivers queued events (one thread at a time, in order); once the
  // request is settled and its last event delivered, tells the source.
  void DeliverOutbox() ABSL_LOCKS_EXCLUDED(mu_);
  // The final event of a request that did not complete: aborted, or failed
  // with `status`.
  void EndLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  engine::RequestPlacement PlacementLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Admission's bookkeeping and the debug line, once the request is over.
  void SettleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RemoteTokenSource* const source_;
  const engine::EngineRequest request_;
  const engine::TokenCallback callback_;
  const absl::Time arrival_;

  mutable absl::Mutex mu_;
  // From admission on (a request refused at the door is counted by the
  // admission's decision alone); null before.
  std::unique_ptr<RequestObserver> observer_ ABSL_GUARDED_BY(mu_);
  Route route_ ABSL_GUARDED_BY(mu_);
  absl::Time admitted_at_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  // The final event was emitted.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int32_t outputs_ ABSL_GUARDED_BY(mu_) = 0;
  // The prefill's first token was emitted; decode messages wait for it.
  bool first_emitted_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::DecodeResponse> held_decode_ ABSL_GUARDED_BY(mu_);
  // The decode stream's completion, held until the prefill stream ended.
  absl::optional<v1::GenerateComplete> held_complete_ ABSL_GUARDED_BY(mu_);
  bool prefill_done_ ABSL_GUARDED_BY(mu_) = false;
  // The first failure of a worker call (the one the client gets).
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  int open_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<engine::TokenEvent> outbox_ ABSL_GUARDED_BY(mu_);
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;
  // SettleLocked ran; the source was told (OnFlightDone).
  bool settled_ ABSL_GUARDED_BY(mu_) = false;
  bool reported_done_ ABSL_GUARDED_BY(mu_) = false;
  // Milestones, on the source's clock, and the workers' own timings.
  absl::Time reserved_at_ ABSL_GUARDED_BY(mu_);
  absl::Time first_token_at_ ABSL_GUARDED_BY(mu_);
  absl::Time last_token_at_ ABSL_GUARDED_BY(mu_);
  absl::Time transfer_done_at_ ABSL_GUARDED_BY(mu_);
  absl::optional<absl::Duration> prefill_queued_ ABSL_GUARDED_BY(mu_);
  // Prompt tokens the prefill worker found cached (its first token's
  // message).
  int32_t prefill_cached_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t prefill_dram_cached_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  absl::optional<absl::Duration> prefill_time_ ABSL_GUARDED_BY(mu_);
  absl::optional<absl::Duration> transfer_time_ ABSL_GUARDED_BY(mu_);
  // The calls. Contexts live as long as the flight, so cancelling one
  // whose call has ended is harmless.
  v1::ReserveKvRequest reserve_request_;
  v1::ReserveKvResponse reserve_response_;
  std::unique_ptr<grpc::ClientContext> reserve_context_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PrefillCall> prefill_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<DecodeCall> decode_ ABSL_GUARDED_BY(mu_);
};

// The Prefill stream of one request.
class RemoteTokenSource::Flight::PrefillCall final
    : public grpc::ClientReadReactor<v1::PrefillResponse> {
 public:
  PrefillCall(Flight* flight, v1::PrefillRequest request, absl::Duration timeout)
      : flight_(flight), request_(std::move(request)) {
    context_.set_deadline(DeadlineIn(timeout));
  }
  void Start(v1::Prefill::Stub* stub) {
    stub->async()->Prefill(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    flight_->OnPrefillMessage(response_);
    response_.Clear();
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override { flight_->OnCallDone(Call::kPrefill, status); }

 private:
  Flight* const flight_;
  grpc::ClientContext context_;
  const v1::PrefillRequest request_;
  v1::PrefillResponse response_;
};

// The Decode stream of one request, read from the start so that a decode
// worker dying while the prefill still runs ends the request at once.
class RemoteTokenSource::Flight::DecodeCall final
    : public grpc::ClientReadReactor<v1::DecodeResponse> {
 public:
  DecodeCall(Flight* flight, v1::DecodeRequest request, absl::Duration timeout)
      : flight_(flight), request_(std::move(request)) {
    context_.set_deadline(DeadlineIn(timeout));
  }
  void Start(v1::Decode::Stub* stub) {
    stub->async()->Decode(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    flight_->OnDecodeMessage(std::move(response_));
    response_ = v1::DecodeResponse();
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override { flight_->OnCallDone(Call::kDecode, status); }

 private:
  Flight* const flight_;
  grpc::ClientContext context_;
  const v1::DecodeRequest request_;
  v1::DecodeResponse response_;
};

void RemoteTokenSource::Flight::Reserve(Route route) {
  std::shared_ptr<Flight> self = shared_from_this();
  v1::Decode::Stub* stub = route.decode_stubs->decode.get();
  bool proceed;
  {
    absl::MutexLock lock(&mu_);
    route_ = std::move(route);
    admitted_at_ = source_->clock_->Now();
    if (observer_ == nullptr) {
      // Admitted and routed: from now on the request counts in flight.
      observer_ = std::make_unique<RequestObserver>(source_->options_.metrics, source_->clock_,
                                                    request_.qos_class, arrival_);
    }
    proceed = !aborted_;
    if (!proceed) {
      EndLocked(absl::OkStatus());
      SettleLocked();
    } else {
      reserve_request_.set_request_id(request_.id);
      reserve_request_.set_num_tokens(static_cast<int32_t>(request_.prompt.size()));
      reserve_request_.set_max_total_tokens(static_cast<int32_t>(request_.prompt.size()) +
                                            request_.max_tokens);
      SetProtoDuration(source_->options_.reserve_lease, reserve_request_.mutable_lease());
      reserve_request_.set_qos_class(request_.qos_class);
      reserve_request_.set_allow_cpu_attention(source_->options_.allow_cpu_attention);
      // The decode worker reserves only what its prefix cache lacks.
      reserve_request_.clear_prompt_token_ids();
      for (int32_t t : request_.prompt) reserve_request_.add_prompt_token_ids(t);
      reserve_request_.set_cache_salt(request_.cache_salt);
      reserve_response_.Clear();
      reserve_context_ = std::make_unique<grpc::ClientContext>();
      reserve_context_->set_deadline(DeadlineIn(source_->options_.reserve_timeout));
      ++open_calls_;
    }
  }
  if (!proceed) {
    DeliverOutbox();
    return;
  }
  stub->async()->ReserveKv(reserve_context_.get(), &reserve_request_, &reserve_response_,
                           [self](grpc::Status status) mutable {
                             if (!self->OnReserved(status)) {
                               self->source_->WaitForKv(self, FromGrpcStatus(status));
                             }
                             // The flight (and the call's context with it)
                             // may end here, inside the callback; never as
                             // gRPC destroys the callback object with the
                             // call, where the context's unref would come
                             // twice.
                             self.reset();
                           });
}

bool RemoteTokenSource::Flight::OnReserved(const grpc::Status& status) {
  bool start = false;
  bool done = false;
  {
    absl::MutexLock lock(&mu_);
    --open_calls_;
    reserved_at_ = source_->clock_->Now();
    if (aborted_) {
      if (status.ok()) {
        ReleaseReservation(route_.decode_stubs->decode.get(), reserve_response_.destination(),
                           "the request was aborted");
      }
      EndLocked(absl::OkStatus());
      done = true;
    } else if (status.ok()) {
      start = true;
    } else if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      // The KV cache is full: the admission slot goes back while the
      // request waits, and the retry is admitted afresh.
      source_->admission_->Release(route_.admission);
      route_.admission = 0;
      return false;
    } else {
      EndLocked(WorkerStatus("ReserveKv", route_.decode_address, status));
      done = true;
    }
    if (done) SettleLocked();
  }
  if (start) StartStreams(reserve_response_.destination());
  if (done) DeliverOutbox();
  return true;
}

void RemoteTokenSource::Flight::SetWaiting(bool waiting) {
  absl::MutexLock lock(&mu_);
  if (observer_ != nullptr) observer_->OnKvWait(waiting);
}

void RemoteTokenSource::Flight::EndWithoutCalls(const absl::Status& status,
                                                absl::optional<admission::RejectReason> rejected) {
  std::shared_ptr<Flight> self = shared_from_this();
  {
    absl::MutexLock lock(&mu_);
    if (rejected.has_value() && observer_ != nullptr) observer_->OnRejected(*rejected);
    EndLocked(status);
    SettleLocked();
  }
  DeliverOutbox();
}

void RemoteTokenSource::Flight::StartStreams(const v1::KvDestination& reserved) {
  v1::KvDestination destination = reserved;
  v1::DecodeRequest decode;
  v1::PrefillRequest prefill;
  PrefillCall* prefill_call;
  DecodeCall* decode_call;
  Route route;
  {
    absl::MutexLock lock(&mu_);
    route = route_;
    if (destination.decode_address().empty()) destination.set_decode_address(route.decode_address);
    decode.set_request_id(request_.id);
    decode.set_reservation_id(destination.reservation_id());
    decode.set_decode_incarnation(destination.decode_incarnation());
    prefill.set_request_id(request_.id);
    for (int32_t t : request_.prompt) {
      decode.add_prompt_token_ids(t);
      prefill.add_prompt_token_ids(t);
    }
    FillSampling(request_, decode.mutable_sampling(), decode.mutable_stop(),
                 decode.mutable_options());
    *prefill.mutable_sampling() = decode.sampling();
    *prefill.mutable_stop() = decode.stop();
    *prefill.mutable_options() = decode.options();
    prefill.set_qos_class(request_.qos_class);
    decode.set_qos_class(request_.qos_class);
    prefill.set_cache_salt(request_.cache_salt);
    decode.set_cache_salt(request_.cache_salt);
    SetProtoDuration(source_->clock_->Now() - arrival_, prefill.mutable_elapsed());
    *prefill.mutable_destination() = destination;
    const absl::Duration timeout = source_->options_.call_timeout;
    decode_ = std::make_unique<DecodeCall>(this, std::move(decode), timeout);
    prefill_ = std::make_unique<PrefillCall>(this, std::move(prefill), timeout);
    decode_call = decode_.get();
    prefill_call = prefill_.get();
    open_calls_ += 2;
  }
  // Decode first: it waits for the hand-off the prefill makes.
  decode_call->Start(route.decode_stubs->decode.get());
  prefill_call->Start(route.prefill_stubs->prefill.get());
}

void RemoteTokenSource::Flight::OnPrefillMessage(const v1::PrefillResponse& p) {
  {
    absl::MutexLock lock(&mu_);
    HandlePrefillLocked(p);
  }
  DeliverOutbox();
}

void RemoteTokenSource::Flight::HandlePrefillLocked(const v1::PrefillResponse& p) {
  if (p.has_started()) {
    prefill_queued_ = (reserved_at_ - arrival_) + DurationFromProto(p.started().queued());
  } else if (p.has_first_token()) {
    prefill_cached_tokens_ = p.cached_tokens();
    prefill_dram_cached_tokens_ = p.dram_cached_tokens();
    // The prompt is computed: the prefill worker's queue is shorter by it
    // from now on (its KV transfer runs beside the next prefills).
    source_->admission_->MarkPrefillDone(route_.admission);
    source_->admission_->ObserveTtft(route_.admission, source_->clock_->Now() - admitted_at_);
    EmitChunkLocked(p.first_token());
    first_emitted_ = true;
    while (!held_decode_.empty()) {
      HandleDecodeLocked(held_decode_.front());
      held_decode_.pop_front();
    }
  } else if (p.has_transfer_done()) {
    transfer_done_at_ = source_->clock_->Now();
    prefill_time_ = DurationFromProto(p.transfer_done().prefill_time());
    transfer_time_ = DurationFromProto(p.transfer_done().transfer_time());
    if (observer_ != nullptr) observer_->OnPrefillDone();
  } else if (p.has_complete()) {
    // The first token ended the request.
    EmitCompleteLocked(p.complete());
  }
}

void RemoteTokenSource::Flight::OnDecodeMessage(v1::DecodeResponse d) {
  {
    absl::MutexLock lock(&mu_);
    if (!first_emitted_) {
      held_decode_.push_back(std::move(d));
      return;
    }
    HandleDecodeLocked(d);
  }
  DeliverOutbox();
}

void RemoteTokenSource::Flight::HandleDecodeLocked(const v1::DecodeResponse& d) {
  if (d.has_chunk()) {
    EmitChunkLocked(d.chunk());
  } else if (d.has_complete()) {
    // The completion waits for the prefill stream's end, which brings the
    // transfer's timings for the placement.
    if (prefill_ != nullptr && !prefill_done_) {
      held_complete_ = d.complete();
    } else {
      EmitCompleteLocked(d.complete());
    }
  }
}

void RemoteTokenSource::Flight::OnCallDone(Call call, const grpc::Status& status) {
  // Callbacks may hold the last other reference; the flight ends here.
  std::shared_ptr<Flight> self = shared_from_this();
  std::vector<std::function<void()>> cancels;
  bool done;
  {
    absl::MutexLock lock(&mu_);
    --open_calls_;
    if (!status.ok() && failure_.ok() && !aborted_ && !finished_ &&
        status.error_code() != grpc::StatusCode::CANCELLED) {
      // The first failure is reported; the other call is cancelled, and
      // its worker frees the sequence's KV.
      failure_ = call == Call::kPrefill ? WorkerStatus("Prefill", route_.prefill_address, status)
                                        : WorkerStatus("Decode", route_.decode_address, status);
      if (call == Call::kPrefill) {
        cancels.push_back([this] { decode_->Cancel(); });
      } else {
        cancels.push_back([this] { prefill_->Cancel(); });
      }
    }
    if (call == Call::kPrefill) {
      if (observer_ != nullptr) observer_->OnPrefillDone();
      prefill_done_ = true;
      if (held_complete_.has_value() && failure_.ok()) EmitCompleteLocked(*held_complete_);
    }
    done = open_calls_ == 0;
    if (done) {
      if (!finished_) {
        EndLocked(aborted_ || !failure_.ok()
                      ? failure_
                      : absl::InternalError("the decode stream ended without a completion"));
      }
      SettleLocked();
    }
  }
  for (auto& cancel : cancels) cancel();
  DeliverOutbox();
}

void RemoteTokenSource::Flight::Abort() {
  std::vector<std::function<void()>> cancels;
  {
    absl::MutexLock lock(&mu_);
    if (finished_ || aborted_) return;
    aborted_ = true;
    if (reserve_context_ != nullptr) {
      grpc::ClientContext* context = reserve_context_.get();
      cancels.push_back([context] { context->TryCancel(); });
    }
    if (prefill_ != nullptr) cancels.push_back([this] { prefill_->Cancel(); });
    if (decode_ != nullptr) cancels.push_back([this] { decode_->Cancel(); });
  }
  for (auto& cancel : cancels) cancel();
}

void RemoteTokenSource::Flight::EmitChunkLocked(const v1::TokenChunk& chunk) {
  for (int i = 0; i < chunk.token_ids_size(); ++i) {
    EmitLocked(EventFrom(request_.id, chunk, i, outputs_));
  }
}

void RemoteTokenSource::Flight::EmitCompleteLocked(const v1::GenerateComplete& complete) {
  engine::TokenEvent end;
  end.request_id = request_.id;
  end.output_index = outputs_;
  end.finish = frontend::FinishReasonFromProto(complete.finish_reason());
  if (complete.has_stop_token_id()) end.matched_stop_token = complete.stop_token_id();
  if (end.finish == engine::FinishReason::kError) {
    end.error = absl::Status(static_cast<absl::StatusCode>(complete.error_code()),
                             complete.error_message());
  }
  end.placement = PlacementLocked();
  end.placement->attention_service_id = complete.placement().attention_service_id();
  // The prefill worker's reuse where one computed the prompt, else the
  // decode worker's (colocated).
  end.cached_tokens = std::max(prefill_cached_tokens_, complete.usage().cached_tokens());
  end.dram_cached_tokens = end.cached_tokens == prefill_cached_tokens_
                               ? prefill_dram_cached_tokens_
                               : complete.usage().dram_cached_tokens();
  if (source_->options_.metrics != nullptr && end.cached_tokens > 0) {
    source_->options_.metrics->OnCachedTokensDelivered(end.cached_tokens);
  }
  EmitLocked(std::move(end));
}

void RemoteTokenSource::Flight::EmitLocked(engine::TokenEvent ev) {
  if (finished_) return;
  if (ev.token >= 0) {
    const absl::Time now = source_->clock_->Now();
    if (outputs_ == 0) first_token_at_ = now;
    last_token_at_ = now;
    ++outputs_;
  }
  finished_ = ev.finish != engine::FinishReason::kNone;
  if (observer_ != nullptr) {
    if (ev.token >= 0 && !finished_) observer_->OnToken();
    if (finished_) observer_->OnFinish(ev.finish);
  }
  outbox_.push_back(std::move(ev));
}

void RemoteTokenSource::Flight::DeliverOutbox() {
  std::shared_ptr<Flight> self = shared_from_this();
  mu_.Lock();
  if (delivering_) {
    mu_.Unlock();
    return;
  }
  delivering_ = true;
  while (!outbox_.empty()) {
    std::deque<engine::TokenEvent> events = std::move(outbox_);
    outbox_.clear();
    mu_.Unlock();
    for (const engine::TokenEvent& ev : events) callback_(ev);
    mu_.Lock();
  }
  delivering_ = false;
  const bool report = settled_ && !reported_done_;
  if (report) reported_done_ = true;
  mu_.Unlock();
  if (report) source_->OnFlightDone(*this);
}

void RemoteTokenSource::Flight::EndLocked(const absl::Status& status) {
  if (finished_) return;
  if (!aborted_ && !status.ok()) {
    TRIDENT_LOG(WARNING) << "request " << request_.id << ": " << status;
  }
  engine::TokenEvent ev;
  ev.request_id = request_.id;
  ev.output_index = outputs_;
  ev.finish =
      aborted_ || status.ok() ? engine::FinishReason::kAborted : engine::FinishReason::kError;
  if (ev.finish == engine::FinishReason::kError) ev.error = status;
  ev.placement = PlacementLocked();
  EmitLocked(std::move(ev));
}

engine::RequestPlacement RemoteTokenSource::Flight::PlacementLocked() const {
  engine::RequestPlacement p;
  p.prefill_worker_id = route_.prefill_id;
  p.decode_worker_id = route_.decode_id;
  p.queued = prefill_queued_;
  p.prefill = prefill_time_;
  p.kv_transfer = transfer_time_;
  return p;
}

void RemoteTokenSource::Flight::SettleLocked() {
  settled_ = true;
  if (route_.admission != 0) {
    if (outputs_ >= 2) {
      // The client's TPOT: the mean gap after the first token.
      source_->admission_->ObserveTpot(route_.admission,
                                       (last_token_at_ - first_token_at_) / (outputs_ - 1));
    }
    source_->admission_->Release(route_.admission);
    route_.admission = 0;
  }
  if (!TRIDENT_LOG_IS_ON(DEBUG) || outputs_ == 0) return;
  // Predictions against outcomes, as the router sees them (client-side
  // latencies add the router's own streaming).
  auto ms = [this](absl::Time t) { return absl::ToDoubleMilliseconds(t - admitted_at_); };
  TRIDENT_LOG(DEBUG) << "request " << request_.id << " prefill " << route_.prefill_address
                     << " decode " << route_.decode_address << " prompt " << request_.prompt.size()
                     << " outputs " << outputs_ << ": predicted ttft_ms "
                     << absl::ToDoubleMilliseconds(route_.predicted_ttft) << " tpot_ms "
                     << absl::ToDoubleMilliseconds(route_.predicted_tpot) << "; actual ttft_ms "
                     << ms(first_token_at_) << " transfer_done_ms " << ms(transfer_done_at_)
                     << " tpot_ms "
                     << (outputs_ > 1
                             ? absl::ToDoubleMilliseconds(last_token_at_ - first_token_at_) /
                                   (outputs_ - 1)
                             : 0.0)
                     << " reserved_ms " << ms(reserved_at_);
}

RemoteTokenSource::RemoteTokenSource(admission::AdmissionController* admission,
                                     RemoteTokenSourceOptions options)
    : admission_(admission),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()) {
  if (options_.timer_thread) timer_thread_ = std::thread([this] { TimerLoop(); });
}

RemoteTokenSource::~RemoteTokenSource() {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    wake_ = true;
    for (const auto& [id, flight] : flights_) ids.push_back(id);
  }
  if (timer_thread_.joinable()) timer_thread_.join();
  for (const std::string& id : ids) Abort(id);
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return flights_.empty(); };
  mu_.Await(absl::Condition(&idle));
}

void RemoteTokenSource::SetWorkerAddress(const std::string& worker_id, const std::string& address) {
  absl::MutexLock lock(&mu_);
  addresses_[worker_id] = address;
}

RemoteTokenSource::Stubs* RemoteTokenSource::StubsFor(const std::string& address) {
  auto& stubs = stubs_[address];
  if (stubs == nullptr) {
    auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    stubs = std::make_unique<Stubs>();
    stubs->prefill = v1::Prefill::NewStub(channel);
    stubs->decode = v1::Decode::NewStub(channel);
  }
  return stubs.get();
}

absl::Status RemoteTokenSource::Submit(engine::EngineRequest request,
                                       engine::TokenCallback callback) {
  const std::string id = request.id;
  const std::string qos_class = request.qos_class;
  auto flight =
      std::make_shared<Flight>(this, std::move(request), std::move(callback), clock_->Now());
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the router is shutting down");
    if (flights_.contains(id)) {
      if (options_.metrics != nullptr) options_.metrics->OnSubmitError(qos_class);
      return absl::AlreadyExistsError(absl::StrCat("request ", id, " is in flight"));
    }
    flights_[id] = flight;
  }
  bool no_room = false;
  absl::Status routed = Route(flight, /*first_attempt=*/true, &no_room);
  if (!routed.ok()) {
    absl::MutexLock lock(&mu_);
    flights_.erase(id);
  }
  return routed;
}

absl::Status RemoteTokenSource::Route(const std::shared_ptr<Flight>& flight, bool first_attempt,
                                      bool* no_room) {
  RouterMetrics* const metrics = options_.metrics;
  const admission::AdmissionRequest ask = flight->AdmissionAsk();
  absl::StatusOr<admission::AdmissionDecision> decision = admission_->Admit(ask);
  if (!decision.ok()) {
    // A retry's failure is counted by the request's observer when it ends.
    if (metrics != nullptr && first_attempt) metrics->OnSubmitError(ask.qos_class);
    return decision.status();
  }
  if (first_attempt) {
    if (metrics != nullptr) metrics->OnDecision(ask.qos_class, *decision);
    if (!decision->admitted) return admission::RejectionStatus(*decision);
    absl::MutexLock lock(&mu_);
    flight->wait_limit = flight->WaitLimit(*decision);
  } else if (!decision->admitted) {
    // Still no KV room anywhere: keep waiting. Any other reason ends the
    // wait with admission's answer.
    *no_room = decision->reason == admission::RejectReason::kKvCapacity;
    return admission::RejectionStatus(*decision);
  }
  Flight::Route route;
  route.admission = decision->id;
  route.decode_id = std::string(decision->decode_worker_id);
  route.prefill_id = std::string(decision->prefill_worker_id);
  route.predicted_ttft = decision->predicted_ttft;
  route.predicted_tpot = decision->predicted_tpot;
  {
    absl::MutexLock lock(&mu_);
    auto d = addresses_.find(route.decode_id);
    auto p = addresses_.find(route.prefill_id);
    if (d == addresses_.end() || p == addresses_.end()) {
      admission_->Release(route.admission);
      if (metrics != nullptr && first_attempt) metrics->OnSubmitError(ask.qos_class);
      return absl::UnavailableError(absl::StrCat(
          "no address for worker ", d == addresses_.end() ? route.decode_id : route.prefill_id));
    }
    route.decode_address = d->second;
    route.prefill_address = p->second;
    route.decode_stubs = StubsFor(d->second);
    route.prefill_stubs = StubsFor(p->second);
  }
  flight->Reserve(std::move(route));
  return absl::OkStatus();
}

void RemoteTokenSource::WaitForKv(const std::shared_ptr<Flight>& flight, const absl::Status& why) {
  const absl::Time now = clock_->Now();
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    stopping = stopping_;
    if (!stopping && now < flight->wait_limit && !flight->aborted()) {
      if (flight->next_try == absl::InfiniteFuture()) {
        flight->retry_interval = options_.kv_retry_interval;
      } else {
        // Backs off while the cache stays full; a request that ends wakes
        // the oldest waiters sooner.
        flight->retry_interval = std::min(flight->retry_interval * 2, absl::Seconds(1));
      }
      flight->next_try = now + flight->retry_interval;
      waiting_.push_back(flight);
      wake_ = true;
      flight->SetWaiting(true);
      return;
    }
  }
  if (stopping || flight->aborted()) {
    flight->EndWithoutCalls(absl::OkStatus(), absl::nullopt);
    return;
  }
  flight->EndWithoutCalls(
      ResourceExhaustedWithRetry(
          absl::StrCat("no decode worker had KV room for ", flight->request().prompt.size(),
                       " prompt + ", flight->request().max_tokens, " output tokens within ",
                       absl::FormatDuration(now - flight->arrival()), " (", why.message(), ")"),
          options_.kv_full_retry_after),
      admission::RejectReason::kKvCapacity);
}

void RemoteTokenSource::OnFlightDone(const Flight& flight) {
  absl::MutexLock lock(&mu_);
  flights_.erase(flight.request().id);
  // Its KV is free again: the oldest waiters ask at once.
  const absl::Time now = clock_->Now();
  int woken = 0;
  for (const std::shared_ptr<Flight>& waiting : waiting_) {
    if (woken++ == 2) break;
    waiting->next_try = std::min(waiting->next_try, now);
    wake_ = true;
  }
}

void RemoteTokenSource::Abort(const std::string& request_id) {
  std::shared_ptr<Flight> flight;
  bool was_waiting = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = flights_.find(request_id);
    if (it == flights_.end()) return;
    flight = it->second;
    auto w = std::find(waiting_.begin(), waiting_.end(), flight);
    if (w != waiting_.end()) {
      waiting_.erase(w);
      was_waiting = true;
    }
  }
  flight->Abort();
  if (was_waiting) {
    flight->SetWaiting(false);
    flight->EndWithoutCalls(absl::OkStatus(), absl::nullopt);
  }
}

void RemoteTokenSource::RunTimers() {
  struct Due {
    std::shared_ptr<Flight> flight;
    bool expired;
  };
  std::vector<Due> due;
  const absl::Time now = clock_->Now();
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      const bool expired = (*it)->wait_limit <= now || stopping_;
      if ((*it)->next_try <= now || expired) {
        due.push_back({std::move(*it), expired});
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const Due& d : due) {
    d.flight->SetWaiting(false);
    if (d.expired) {
      WaitForKv(d.flight, absl::ResourceExhaustedError("the KV cache stayed full"));
      continue;
    }
    bool no_room = false;
    const absl::Status routed = Route(d.flight, /*first_attempt=*/false, &no_room);
    if (no_room) {
      WaitForKv(d.flight, routed);
    } else if (!routed.ok()) {
      d.flight->EndWithoutCalls(routed, absl::nullopt);
    }
  }
}

void RemoteTokenSource::TimerLoop() {
  mu_.Lock();
  while (!stopping_) {
    absl::Time next = absl::InfiniteFuture();
    for (const std::shared_ptr<Flight>& flight : waiting_) {
      next = std::min({next, flight->next_try, flight->wait_limit});
    }
    const absl::Duration delay = next - clock_->Now();
    if (delay > absl::ZeroDuration() && !wake_) {
      auto woken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return wake_ || stopping_; };
      mu_.AwaitWithTimeout(absl::Condition(&woken), std::min(delay, absl::Seconds(1)));
    }
    wake_ = false;
    if (stopping_) break;
    mu_.Unlock();
    RunTimers();
    mu_.Lock();
  }
  mu_.Unlock();
  // Ends whatever still waits.
  RunTimers();
}

void RemoteTokenSource::RunTimersForTesting() { RunTimers(); }

void RemoteTokenSource::AwaitWaitingKvForTesting(int n) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(waiting_.size()) >= n;
  };
  mu_.Await(absl::Condition(&enough));
}

int RemoteTokenSource::num_waiting_kv() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(waiting_.size());
}

int RemoteTokenSource::num_in_flight() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(flights_.size());
}

}  // namespace trident::router
