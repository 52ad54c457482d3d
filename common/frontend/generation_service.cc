#include "common/frontend/generation_service.h"

#include <deque>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/frontend/request_proto.h"
#include "common/grpc/reactors.h"
#include "common/grpc/status.h"
#include "common/grpc/wire_check.h"
#include "common/logging/log.h"
#include "common/sampling/sampling_params.h"
#include "common/sampling/stop_checker.h"
#include "common/status/error_details.h"
#include "common/status/status_macros.h"
#include "common/time/proto_time.h"
#include "google/protobuf/duration.pb.h"

namespace trident::frontend {
namespace {

namespace v1 = ::trident::v1;

constexpr char kRequestIdMetadata[] = "trident-request-id";
// GenerateRequest.cache_salt's limit.
constexpr size_t kMaxCacheSaltBytes = 256;

// A name field (request_id, qos_class): at most `max_bytes` of printable
// ASCII.
absl::Status CheckPrintableName(absl::string_view field, const std::string& value,
                                size_t max_bytes) {
  if (value.size() > max_bytes) {
    return InvalidArgumentForField(
        field, absl::StrCat("has ", value.size(), " bytes; at most ", max_bytes, " are allowed"));
  }
  for (unsigned char c : value) {
    if (c < 0x21 || c > 0x7e) {
      return InvalidArgumentForField(field, "must be printable ASCII (0x21-0x7E)");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRequestId(const std::string& id) {
  return CheckPrintableName("request_id", id, 128);
}

// An SLO target: a valid, positive duration of at most a day.
absl::Status CheckTarget(absl::string_view field, const google::protobuf::Duration& d) {
  const bool valid = d.seconds() >= 0 && d.seconds() <= 86'400 && d.nanos() >= 0 &&
                     d.nanos() < 1'000'000'000 && (d.seconds() > 0 || d.nanos() > 0);
  if (valid) return absl::OkStatus();
  return InvalidArgumentForField(field,
                                 absl::StrCat("is ", d.seconds(), "s ", d.nanos(),
                                              "ns; must be a positive duration of at most a day"));
}

// One of the server's QoS classes (ModelInfoResponse.qos_classes), or empty
// for the default; a server that lists none (a worker serving directly)
// takes any name as a label. At most 64 printable ASCII bytes either way.
absl::Status CheckQosClass(const std::string& qos_class, const v1::ModelInfoResponse& info) {
  TRIDENT_RETURN_IF_ERROR(CheckPrintableName("qos_class", qos_class, 64));
  if (qos_class.empty() || info.qos_classes().empty()) return absl::OkStatus();
  std::string known;
  for (const v1::QosClass& c : info.qos_classes()) {
    if (c.name() == qos_class) return absl::OkStatus();
    absl::StrAppend(&known, known.empty() ? "" : ", ", c.name());
  }
  return InvalidArgumentForField(
      "qos_class",
      absl::StrCat("\"", qos_class, "\" is not a QoS class here (known: ", known, ")"));
}

}  // namespace

// One Generate call. The reactor is owned by gRPC (deleted in OnDone); the
// engine's callback holds the shared State, which outlives the reactor.
class GenerationService::Stream final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  struct State {
    absl::Mutex mu;
    Stream* reactor ABSL_GUARDED_BY(mu) = nullptr;
    std::deque<v1::GenerateResponse> pending ABSL_GUARDED_BY(mu);
    bool writing ABSL_GUARDED_BY(mu) = false;
    bool final_queued ABSL_GUARDED_BY(mu) = false;
    // The call's status once final_queued (not OK when the request failed).
    grpc::Status final_status ABSL_GUARDED_BY(mu);
    bool finished ABSL_GUARDED_BY(mu) = false;
    bool cancelled ABSL_GUARDED_BY(mu) = false;

    // Touched only by the engine's token callbacks (its delivery thread) after Start.
    std::string request_id;
    int32_t prompt_tokens = 0;
    int32_t completion_tokens = 0;
    // Prompt tokens whose KV came from a cache (TokenEvent::cached_tokens).
    int32_t cached_tokens = 0;
    int32_t dram_cached_tokens = 0;
    bool text_deltas = false;
    bool logprobs = false;
    std::unique_ptr<tokenizer::IncrementalDecoder> decoder;
    std::unique_ptr<sampling::StopChecker> checker;
    std::vector<int32_t> prompt_ids_for_first_chunk;
    absl::Time submitted;
    absl::Time first_token;
    bool done_by_stop_string = false;
    // Admitted by the gate (a worker's role); ends with the call.
    std::unique_ptr<CallTicket> ticket;
  };

  Stream(GenerationService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context), state_(std::make_shared<State>()) {
    absl::MutexLock lock(&state_->mu);
    state_->reactor = this;
  }

  // Validates and submits; on error finishes at once.
  void Start(const Principal& caller, const v1::GenerateRequest& request) {
    absl::Status status = Submit(caller, request);
    if (!status.ok()) {
      if (registered_) service_->Unregister(state_->request_id);
      registered_ = false;
      Finish(ToGrpcStatus(status));
    }
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&state_->mu);
    state_->writing = false;
    if (!state_->pending.empty()) state_->pending.pop_front();
    if (!ok) {
      state_->cancelled = true;
    }
    PumpLocked();
  }

  void OnCancel() override {
    service_->engine_->Abort(state_->request_id);
    absl::MutexLock lock(&state_->mu);
    state_->cancelled = true;
    PumpLocked();
  }

  void OnDone() override {
    bool ended;
    {
      absl::MutexLock lock(&state_->mu);
      state_->reactor = nullptr;
      ended = state_->final_queued;
    }
    // A request the client left (cancelled, deadline, broken stream) is
    // still in the engine: end it there before its id is free again.
    if (registered_ && !ended) service_->engine_->Abort(state_->request_id);
    if (registered_) service_->Unregister(state_->request_id);
    delete this;
  }

 private:
  absl::Status Submit(const Principal& caller, const v1::GenerateRequest& request) {
    TRIDENT_RETURN_IF_ERROR(service_->CheckModel(request.model()));
    std::string id = request.request_id();
    TRIDENT_RETURN_IF_ERROR(ValidateRequestId(id));
    if (id.empty()) {
      id = absl::StrFormat("gen-%012x-%d", service_->id_salt_ & 0xffffffffffffull,
                           service_->next_id_.fetch_add(1));
    }
    state_->request_id = id;
    TRIDENT_RETURN_IF_ERROR(AdmitThroughGate(id));
    TRIDENT_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, PromptOf(request));
    TRIDENT_ASSIGN_OR_RETURN(engine::EngineRequest er, EngineRequestFor(request, std::move(prompt)));
    TRIDENT_ASSIGN_OR_RETURN(er.qos_class, QosClassFor(caller, request.qos_class()));
    er.id = id;
    TRIDENT_RETURN_IF_ERROR(service_->Register(id, caller.tenant));
    registered_ = true;
    context_->AddInitialMetadata(kRequestIdMetadata, id);
    state_->submitted = service_->clock_->Now();
    std::shared_ptr<State> state = state_;
    GenerationService* service = service_;
    return service_->engine_->Submit(std::move(er), [state, service](const engine::TokenEvent& ev) {
      OnEvent(*state, *service, ev);
    });
  }

  // A gate that gives up waiting for the call (a role change) ends it with
  // `why` and ends the sequence in the engine.
  absl::Status AdmitThroughGate(const std::string& id) {
    if (service_->gate_ == nullptr) return absl::OkStatus();
    std::weak_ptr<State> weak = state_;
    engine::TokenSource* engine = service_->engine_;
    auto abort = [weak, engine](const absl::Status& why) {
      std::shared_ptr<State> s = weak.lock();
      if (s == nullptr) return;
      {
        absl::MutexLock lock(&s->mu);
        if (s->reactor != nullptr && !s->final_queued) {
          s->final_status = ToGrpcStatus(why);
          s->final_queued = true;
          s->reactor->PumpLocked();
        }
      }
      engine->Abort(s->request_id);
    };
    TRIDENT_ASSIGN_OR_RETURN(state_->ticket, service_->gate_->Admit(id, std::move(abort)));
    return absl::OkStatus();
  }

  // The prompt's token ids: the text tokenized, or the ids checked against
  // the vocabulary.
  absl::StatusOr<std::vector<int32_t>> PromptOf(const v1::GenerateRequest& request) const {
    const v1::ModelInfoResponse& info = service_->model_info_;
    std::vector<int32_t> prompt;
    switch (request.prompt_case()) {
      case v1::GenerateRequest::kText:
        return service_->tokenizer_->Encode(
            request.text(), !request.has_add_special_tokens() || request.add_special_tokens());
      case v1::GenerateRequest::kTokenIds:
        for (int i = 0; i < request.token_ids().ids_size(); ++i) {
          const int32_t t = request.token_ids().ids(i);
          if (t < 0 || t >= info.vocab_size()) {
            return InvalidArgumentForField(
                absl::StrCat("token_ids.ids[", i, "]"),
                absl::StrCat("token id ", t, " is outside [0, ", info.vocab_size(), ")"));
          }
          prompt.push_back(t);
        }
        return prompt;
      default:
        return InvalidArgumentForField("prompt", "set exactly one of text or token_ids");
    }
  }

  // Validates sampling and stop conditions, sets up the stream's decoder
  // and stop checker, and returns the engine's request (without its id).
  absl::StatusOr<engine::EngineRequest> EngineRequestFor(const v1::GenerateRequest& request,
                                                         std::vector<int32_t> prompt) {
    const v1::ModelInfoResponse& info = service_->model_info_;
    const int32_t prompt_len = static_cast<int32_t>(prompt.size());
    std::random_device rd;
    const uint64_t default_seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    TRIDENT_ASSIGN_OR_RETURN(
        sampling::SamplingParams sampling,
        sampling::SamplingParamsFromProto(request.sampling(), request.options(), info.vocab_size(),
                                          default_seed));
    TRIDENT_ASSIGN_OR_RETURN(
        sampling::StopParams stop,
        sampling::StopParamsFromProto(request.sampling(), request.stop(), info.vocab_size(),
                                      info.max_context_tokens(), prompt_len));

    if (request.cache_salt().size() > kMaxCacheSaltBytes) {
      return InvalidArgumentForField(
          "cache_salt", absl::StrCat("has ", request.cache_salt().size(), " bytes; at most ",
                                     kMaxCacheSaltBytes, " are allowed"));
    }
    TRIDENT_RETURN_IF_ERROR(CheckQosClass(request.qos_class(), info));
    if (request.slo().has_ttft())
      TRIDENT_RETURN_IF_ERROR(CheckTarget("slo.ttft", request.slo().ttft()));
    if (request.slo().has_tpot())
      TRIDENT_RETURN_IF_ERROR(CheckTarget("slo.tpot", request.slo().tpot()));

    State& s = *state_;
    s.prompt_tokens = prompt_len;
    s.text_deltas = request.options().text_deltas();
    s.logprobs = sampling.logprobs || sampling.top_logprobs > 0;
    if (request.options().return_prompt_token_ids()) s.prompt_ids_for_first_chunk = prompt;
    std::vector<int32_t> eos(info.eos_token_ids().begin(), info.eos_token_ids().end());
    // Stop strings are matched on text without special tokens; text deltas
    // include them only when asked.
    const bool skip_special = !request.options().include_special_tokens_in_text();
    if (s.text_deltas || !stop.stop_strings.empty()) {
      s.decoder = std::make_unique<tokenizer::IncrementalDecoder>(*service_->tokenizer_,
                                                                  skip_special, prompt);
    }
    s.checker = std::make_unique<sampling::StopChecker>(stop, eos);

    engine::EngineRequest er;
    er.prompt = std::move(prompt);
    er.sampling = sampling;
    er.max_tokens = stop.max_tokens;
    er.stop_token_ids = stop.stop_token_ids;
    if (!stop.ignore_eos) er.stop_token_ids.insert(er.stop_token_ids.end(), eos.begin(), eos.end());
    er.cache_salt = request.cache_salt();
    if (request.slo().has_ttft()) er.ttft_slo = DurationFromProto(request.slo().ttft());
    if (request.slo().has_tpot()) er.tpot_slo = DurationFromProto(request.slo().tpot());
    // The client's deadline, as time left: token sources measure it on
    // their own clock.
    const auto deadline = context_->deadline();
    if (deadline != std::chrono::system_clock::time_point::max()) {
      er.time_limit = absl::FromChrono(deadline) - absl::Now();
    }
    return er;
  }

  // Engine thread.
  static void OnEvent(State& s, GenerationService& service, const engine::TokenEvent& ev) {
    if (s.done_by_stop_string) return;
    const absl::Time now = service.clock_->Now();
    std::vector<v1::GenerateResponse> out;
    engine::FinishReason finish = ev.finish;
    absl::optional<std::string> matched_string;
    std::string text;
    if (ev.token >= 0) {
      if (s.completion_tokens == 0) s.first_token = now;
      s.cached_tokens = std::max(s.cached_tokens, ev.cached_tokens);
      s.dram_cached_tokens = std::max(s.dram_cached_tokens, ev.dram_cached_tokens);
      ++s.completion_tokens;
      std::string delta;
      if (s.decoder != nullptr) {
        auto pushed = s.decoder->Push(ev.token);
        if (pushed.ok()) delta = std::move(*pushed);
        // Bytes held for an unfinished character come out (as U+FFFD) at
        // the end.
        if (finish != engine::FinishReason::kNone) delta += s.decoder->Finish();
      }
      sampling::StopChecker::Update update = s.checker->OnToken(ev.token, delta);
      text = std::move(update.text_to_emit);
      if (update.finished && update.reason == sampling::FinishReason::kStopString) {
        matched_string = update.matched_stop;
        finish = engine::FinishReason::kStop;
        s.done_by_stop_string = true;
        service.engine_->Abort(s.request_id);
      }
      v1::GenerateResponse response;
      v1::TokenChunk* chunk = response.mutable_chunk();
      chunk->set_request_id(s.request_id);
      chunk->add_token_ids(ev.token);
      if (!s.prompt_ids_for_first_chunk.empty()) {
        for (int32_t t : s.prompt_ids_for_first_chunk) chunk->add_prompt_token_ids(t);
        s.prompt_ids_for_first_chunk.clear();
      }
      if (s.logprobs) {
        AppendLogprobs(ev, chunk);
      }
      out.push_back(std::move(response));
    }
    if (finish != engine::FinishReason::kNone) {
      // Text held back for a possible stop string ends the output.
      text += s.checker->Finish().text_to_emit;
    }
    if (s.text_deltas && !text.empty()) {
      if (out.empty()) {
        v1::GenerateResponse response;
        response.mutable_chunk()->set_request_id(s.request_id);
        out.push_back(std::move(response));
      }
      out.back().mutable_chunk()->set_text_delta(text);
    }
    if (finish != engine::FinishReason::kNone) {
      v1::GenerateResponse response = Completion(s, ev, finish, matched_string, now);
      // A failed request ends with the failure as the call's status (after
      // the tokens it streamed), not with a completion.
      if (finish != engine::FinishReason::kError) out.push_back(std::move(response));
    }
    absl::MutexLock lock(&s.mu);
    if (s.reactor == nullptr || s.final_queued) return;
    if (finish == engine::FinishReason::kError) {
      s.final_status = ToGrpcStatus(
          ev.error.ok() ? absl::InternalError("the model backend failed during this request")
                        : ev.error);
    }
    for (auto& r : out) s.pending.push_back(std::move(r));
    if (finish != engine::FinishReason::kNone) s.final_queued = true;
    s.reactor->PumpLocked();
  }

  // The stream's last message: why it ended, usage, timings and, where the
  // token source says, where it ran.
  static v1::GenerateResponse Completion(const State& s, const engine::TokenEvent& ev,
                                         engine::FinishReason finish,
                                         const absl::optional<std::string>& matched_string,
                                         absl::Time now) {
    v1::GenerateResponse response;
    v1::GenerateComplete* complete = response.mutable_complete();
    complete->set_request_id(s.request_id);
    complete->set_finish_reason(FinishReasonToProto(finish));
    if (matched_string.has_value()) {
      complete->set_stop_string(*matched_string);
    } else if (ev.finish == engine::FinishReason::kStop) {
      complete->set_stop_token_id(ev.matched_stop_token);
    }
    complete->mutable_usage()->set_prompt_tokens(s.prompt_tokens);
    complete->mutable_usage()->set_completion_tokens(s.completion_tokens);
    // Token sources that learn it only at the end report it there.
    complete->mutable_usage()->set_cached_tokens(
        std::min(s.prompt_tokens, std::max(s.cached_tokens, ev.cached_tokens)));
    complete->mutable_usage()->set_dram_cached_tokens(std::min(
        complete->usage().cached_tokens(), std::max(s.dram_cached_tokens, ev.dram_cached_tokens)));
    v1::Timings* t = complete->mutable_timings();
    SetProtoDuration(now - s.submitted, t->mutable_end_to_end());
    if (s.completion_tokens > 0) {
      SetProtoDuration(s.first_token - s.submitted, t->mutable_time_to_first_token());
      SetProtoDuration(now - s.first_token, t->mutable_decode());
      if (s.completion_tokens > 1) {
        SetProtoDuration((now - s.first_token) / (s.completion_tokens - 1),
                         t->mutable_time_per_output_token());
      }
    }
    if (ev.placement.has_value()) {
      const engine::RequestPlacement& p = *ev.placement;
      complete->mutable_placement()->set_prefill_worker_id(p.prefill_worker_id);
      complete->mutable_placement()->set_decode_worker_id(p.decode_worker_id);
      complete->mutable_placement()->set_attention_service_id(p.attention_service_id);
      if (p.queued.has_value()) SetProtoDuration(*p.queued, t->mutable_queued());
      if (p.prefill.has_value()) SetProtoDuration(*p.prefill, t->mutable_prefill());
      if (p.kv_transfer.has_value()) SetProtoDuration(*p.kv_transfer, t->mutable_kv_transfer());
    }
    return response;
  }

  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_->mu) {
    State& s = *state_;
    if (s.writing || s.finished) return;
    if (s.cancelled) {
      s.finished = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request"));
      return;
    }
    if (!s.pending.empty()) {
      if (absl::Status serialized = SerializeResponse(s.pending.front(), &write_buffer_);
          !serialized.ok()) {
        s.finished = true;
        Finish(ToGrpcStatus(serialized));
        return;
      }
      s.writing = true;
      StartWrite(&write_buffer_);
      return;
    }
    if (s.final_queued) {
      s.finished = true;
      Finish(s.final_status);
    }
  }

  GenerationService* service_;
  grpc::CallbackServerContext* context_;
  std::shared_ptr<State> state_;
  bool registered_ = false;
  // The message being written (pending.front(), serialized); guarded by
  // state_->mu until StartWrite, then gRPC's until OnWriteDone.
  grpc::ByteBuffer write_buffer_;
};

GenerationService::GenerationService(engine::TokenSource* engine,
                                     const tokenizer::Tokenizer* tokenizer,
                                     const v1::ModelInfoResponse& model_info, Clock* clock,
                                     CallGate* gate, Authenticator* authenticator)
    : engine_(engine),
      tokenizer_(tokenizer),
      model_info_(model_info),
      clock_(clock),
      gate_(gate),
      authenticator_(authenticator) {
  std::random_device rd;
  id_salt_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

absl::StatusOr<Principal> GenerationService::Authenticate(
    const grpc::CallbackServerContext& context) const {
  if (authenticator_ == nullptr) return Principal{};
  return authenticator_->Authenticate(context);
}

absl::Status GenerationService::CheckModel(const std::string& model) const {
  if (model.empty() || model == model_info_.model()) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("model \"", model,
                                          "\" is not served here; this worker serves \"",
                                          model_info_.model(), "\""));
}

absl::Status GenerationService::Register(const std::string& id, const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  if (!live_.emplace(id, tenant).second) {
    return absl::AlreadyExistsError(absl::StrCat("request ", id, " is already in flight"));
  }
  return absl::OkStatus();
}

void GenerationService::Unregister(const std::string& id) {
  absl::MutexLock lock(&mu_);
  live_.erase(id);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  absl::StatusOr<Principal> caller = Authenticate(*context);
  if (!caller.ok()) return new FinishedWriteReactor<grpc::ByteBuffer>(caller.status());
  v1::GenerateRequest parsed;
  if (absl::Status status = ParseRequest(*request, &parsed); !status.ok()) {
    return new FinishedWriteReactor<grpc::ByteBuffer>(status);
  }
  auto* stream = new Stream(this, context);
  stream->Start(*caller, parsed);
  return stream;
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  if (absl::StatusOr<Principal> caller = Authenticate(*context); !caller.ok()) {
    return FinishUnary(context, caller.status());
  }
  return FinishRawUnary<v1::TokenizeRequest, v1::TokenizeResponse>(
      context, *request, response, [this](const v1::TokenizeRequest& r, v1::TokenizeResponse* out) {
        return DoTokenize(r, out);
      });
}

grpc::ServerUnaryReactor* GenerationService::Detokenize(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  if (absl::StatusOr<Principal> caller = Authenticate(*context); !caller.ok()) {
    return FinishUnary(context, caller.status());
  }
  return FinishRawUnary<v1::DetokenizeRequest, v1::DetokenizeResponse>(
      context, *request, response,
      [this](const v1::DetokenizeRequest& r, v1::DetokenizeResponse* out) {
        return DoDetokenize(r, out);
      });
}

grpc::ServerUnaryReactor* GenerationService::Abort(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  absl::StatusOr<Principal> caller = Authenticate(*context);
  if (!caller.ok()) return FinishUnary(context, caller.status());
  return FinishRawUnary<v1::AbortRequest, v1::AbortResponse>(
      context, *request, response,
      [this, &caller](const v1::AbortRequest& r, v1::AbortResponse* out) {
        return DoAbort(*caller, r, out);
      });
}

grpc::ServerUnaryReactor* GenerationService::ModelInfo(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  if (absl::StatusOr<Principal> caller = Authenticate(*context); !caller.ok()) {
    return FinishUnary(context, caller.status());
  }
  return FinishRawUnary<v1::ModelInfoRequest, v1::ModelInfoResponse>(
      context, *request, response, [this](const v1::ModelInfoRequest&, v1::ModelInfoResponse* out) {
        *out = model_info_;
        return absl::OkStatus();
      });
}

absl::Status GenerationService::DoTokenize(const v1::TokenizeRequest& request,
                                           v1::TokenizeResponse* response) const {
  TRIDENT_RETURN_IF_ERROR(CheckModel(request.model()));
  const bool add_special = !request.has_add_special_tokens() || request.add_special_tokens();
  for (int32_t id : tokenizer_->Encode(request.text(), add_special)) {
    response->add_token_ids(id);
    if (request.return_token_strings()) response->add_token_strings(tokenizer_->IdToToken(id));
  }
  return absl::OkStatus();
}

absl::Status GenerationService::DoDetokenize(const v1::DetokenizeRequest& request,
                                             v1::DetokenizeResponse* response) const {
  TRIDENT_RETURN_IF_ERROR(CheckModel(request.model()));
  std::vector<int32_t> ids(request.token_ids().begin(), request.token_ids().end());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= model_info_.vocab_size()) {
      return InvalidArgumentForField(
          absl::StrCat("token_ids[", i, "]"),
          absl::StrCat("token id ", ids[i], " is outside [0, ", model_info_.vocab_size(), ")"));
    }
  }
  TRIDENT_ASSIGN_OR_RETURN(std::string text,
                           tokenizer_->Decode(ids, !request.include_special_tokens()));
  response->set_text(std::move(text));
  return absl::OkStatus();
}

absl::Status GenerationService::DoAbort(const Principal& caller, const v1::AbortRequest& request,
                                        v1::AbortResponse* response) {
  bool live;
  {
    absl::MutexLock lock(&mu_);
    // Another tenant's request is answered as one not in flight.
    auto it = live_.find(request.request_id());
    live = it != live_.end() && it->second == caller.tenant;
  }
  if (live) {
    TRIDENT_LOG(INFO) << "aborting request " << request.request_id()
                      << (request.reason().empty() ? "" : ": ") << request.reason();
    engine_->Abort(request.request_id());
  }
  response->set_aborted(live);
  return absl::OkStatus();
}

}  // namespace trident::frontend
