#include "services/router/remote_token_source.h"

#include <atomic>
#include <deque>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging/log.h"
#include "common/time/proto_time.h"
#include "services/worker/worker_request.h"

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

}  // namespace

struct RemoteTokenSource::Flight {
  engine::EngineRequest request;
  engine::TokenCallback callback;
  admission::AdmissionId admission = 0;
  // For the debug line at the end: the admission's predictions and when the
  // request reached its milestones.
  absl::Duration predicted_ttft;
  absl::Duration predicted_tpot;
  absl::Time admitted;
  std::string prefill_address;
  std::string decode_address;
  Stubs* prefill_stubs = nullptr;
  Stubs* decode_stubs = nullptr;
  // Stage, latencies and outcome in the router's metrics.
  std::unique_ptr<RequestObserver> observer;
  // Cancellation: the contexts of the calls in progress.
  absl::Mutex mu;
  bool aborted ABSL_GUARDED_BY(mu) = false;
  grpc::ClientContext* prefill_context ABSL_GUARDED_BY(mu) = nullptr;
  grpc::ClientContext* decode_context ABSL_GUARDED_BY(mu) = nullptr;
};

RemoteTokenSource::RemoteTokenSource(admission::AdmissionController* admission,
                                     RemoteTokenSourceOptions options)
    : admission_(admission),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()) {}

RemoteTokenSource::~RemoteTokenSource() {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (const auto& [id, flight] : flights_) ids.push_back(id);
  }
  for (const std::string& id : ids) Abort(id);
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_threads_ == 0; };
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
  const absl::Time arrival = clock_->Now();
  RouterMetrics* const metrics = options_.metrics;
  admission::AdmissionRequest ask;
  ask.prompt_tokens = static_cast<int64_t>(request.prompt.size());
  ask.max_output_tokens = request.max_tokens;
  ask.qos_class = request.qos_class;
  ask.ttft = request.ttft_slo;
  ask.tpot = request.tpot_slo;
  absl::StatusOr<admission::AdmissionDecision> decision = admission_->Admit(ask);
  if (!decision.ok()) {
    if (metrics != nullptr) metrics->OnSubmitError(ask.qos_class);
    return decision.status();
  }
  if (metrics != nullptr) metrics->OnDecision(ask.qos_class, *decision);
  if (!decision->admitted) return admission::RejectionStatus(*decision);
  auto flight = std::make_shared<Flight>();
  flight->admission = decision->id;
  flight->predicted_ttft = decision->predicted_ttft;
  flight->predicted_tpot = decision->predicted_tpot;
  flight->admitted = absl::Now();
  const std::string decode_id(decision->decode_worker_id);
  const std::string prefill_id(decision->prefill_worker_id);
  {
    absl::MutexLock lock(&mu_);
    auto d = addresses_.find(decode_id);
    auto p = addresses_.find(prefill_id);
    if (stopping_ || d == addresses_.end() || p == addresses_.end()) {
      admission_->Release(flight->admission);
      if (metrics != nullptr) metrics->OnSubmitError(ask.qos_class);
      return absl::UnavailableError(
          absl::StrCat("no address for worker ", d == addresses_.end() ? decode_id : prefill_id));
    }
    if (flights_.contains(request.id)) {
      admission_->Release(flight->admission);
      if (metrics != nullptr) metrics->OnSubmitError(ask.qos_class);
      return absl::AlreadyExistsError(absl::StrCat("request ", request.id, " is in flight"));
    }
    flight->decode_address = d->second;
    flight->prefill_address = p->second;
    flight->decode_stubs = StubsFor(d->second);
    flight->prefill_stubs = StubsFor(p->second);
    flight->request = std::move(request);
    flight->callback = std::move(callback);
    flight->observer = std::make_unique<RequestObserver>(metrics, clock_, ask.qos_class, arrival);
    flights_[flight->request.id] = flight;
    ++running_threads_;
  }
  std::thread([this, flight] { Run(flight); }).detach();
  return absl::OkStatus();
}

void RemoteTokenSource::Abort(const std::string& request_id) {
  std::shared_ptr<Flight> flight;
  {
    absl::MutexLock lock(&mu_);
    auto it = flights_.find(request_id);
    if (it == flights_.end()) return;
    flight = it->second;
  }
  absl::MutexLock lock(&flight->mu);
  flight->aborted = true;
  if (flight->prefill_context != nullptr) flight->prefill_context->TryCancel();
  if (flight->decode_context != nullptr) flight->decode_context->TryCancel();
}

void RemoteTokenSource::Run(std::shared_ptr<Flight> flight) {
  const engine::EngineRequest& r = flight->request;
  int32_t outputs = 0;
  bool finished = false;
  // Milestones for the debug line: first token, KV transfer done, second
  // token (the first from decode), last token.
  absl::Time started = absl::Now(), reserved_at, prefill_started, first_token, transfer_done,
             second_token, last_token;
  auto emit = [&](engine::TokenEvent ev) {
    if (finished) return;
    if (ev.finish == engine::FinishReason::kNone || ev.token >= 0) {
      const absl::Time now = absl::Now();
      if (ev.output_index == 0) first_token = now;
      if (ev.output_index == 1) second_token = now;
      last_token = now;
    }
    finished = ev.finish != engine::FinishReason::kNone;
    if (ev.token >= 0 && !finished) flight->observer->OnToken();
    if (finished) flight->observer->OnFinish(ev.finish);
    flight->callback(ev);
  };
  auto fail = [&](const std::string& why) {
    bool aborted;
    {
      absl::MutexLock lock(&flight->mu);
      aborted = flight->aborted;
    }
    if (!aborted) TRIDENT_LOG(WARNING) << "request " << r.id << ": " << why;
    engine::TokenEvent ev;
    ev.request_id = r.id;
    ev.output_index = outputs;
    ev.finish = aborted ? engine::FinishReason::kAborted : engine::FinishReason::kError;
    // A worker that failed or vanished: the client may retry (UNAVAILABLE).
    if (!aborted) ev.error = absl::UnavailableError(why);
    emit(ev);
  };
  const auto deadline = absl::ToChronoTime(absl::Now() + options_.call_timeout);

  // 1. The reservation.
  v1::ReserveKvRequest reserve;
  reserve.set_request_id(r.id);
  reserve.set_num_tokens(static_cast<int32_t>(r.prompt.size()));
  reserve.set_max_total_tokens(static_cast<int32_t>(r.prompt.size()) + r.max_tokens);
  SetProtoDuration(options_.reserve_lease, reserve.mutable_lease());
  reserve.set_qos_class(r.qos_class);
  v1::ReserveKvResponse reserved;
  grpc::Status status;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    status = flight->decode_stubs->decode->ReserveKv(&context, reserve, &reserved);
    reserved_at = absl::Now();
  }
  if (!status.ok()) {
    fail(absl::StrCat("ReserveKv on ", flight->decode_address, ": ", status.error_message()));
  } else {
    v1::KvDestination destination = reserved.destination();
    if (destination.decode_address().empty())
      destination.set_decode_address(flight->decode_address);
    v1::DecodeRequest decode;
    decode.set_request_id(r.id);
    decode.set_reservation_id(destination.reservation_id());
    decode.set_decode_incarnation(destination.decode_incarnation());
    v1::PrefillRequest prefill;
    prefill.set_request_id(r.id);
    for (int32_t t : r.prompt) {
      decode.add_prompt_token_ids(t);
      prefill.add_prompt_token_ids(t);
    }
    FillSampling(r, decode.mutable_sampling(), decode.mutable_stop(), decode.mutable_options());
    *prefill.mutable_sampling() = decode.sampling();
    *prefill.mutable_stop() = decode.stop();
    *prefill.mutable_options() = decode.options();
    prefill.set_qos_class(r.qos_class);
    decode.set_qos_class(r.qos_class);
    *prefill.mutable_destination() = destination;

    // 2. Decode waits for the hand-off; 3. prefill computes and sends.
    grpc::ClientContext decode_context;
    decode_context.set_deadline(deadline);
    grpc::ClientContext prefill_context;
    prefill_context.set_deadline(deadline);
    bool aborted_early;
    {
      absl::MutexLock lock(&flight->mu);
      aborted_early = flight->aborted;
      flight->decode_context = &decode_context;
      flight->prefill_context = &prefill_context;
    }
    if (aborted_early) {
      decode_context.TryCancel();
      prefill_context.TryCancel();
    }
    auto decode_reader = flight->decode_stubs->decode->Decode(&decode_context, decode);
    // The decode stream is read on its own thread from the start, so that a
    // decode worker dying while the prefill still runs ends the request at
    // once: its failure cancels the prefill call (whose worker then frees
    // the prompt's blocks). Its tokens are emitted after the prefill's.
    struct DecodeStream {
      absl::Mutex mu;
      std::deque<v1::DecodeResponse> responses ABSL_GUARDED_BY(mu);
      bool ended ABSL_GUARDED_BY(mu) = false;
      grpc::Status status ABSL_GUARDED_BY(mu);
    } stream;
    std::thread decode_thread([&] {
      v1::DecodeResponse d;
      while (decode_reader->Read(&d)) {
        absl::MutexLock lock(&stream.mu);
        stream.responses.push_back(std::move(d));
        d = v1::DecodeResponse();
      }
      grpc::Status s = decode_reader->Finish();
      if (!s.ok()) prefill_context.TryCancel();
      absl::MutexLock lock(&stream.mu);
      stream.status = std::move(s);
      stream.ended = true;
    });
    auto prefill_reader = flight->prefill_stubs->prefill->Prefill(&prefill_context, prefill);
    v1::PrefillResponse p;
    while (prefill_reader->Read(&p)) {
      if (p.has_started()) {
        prefill_started = absl::Now();
      } else if (p.has_first_token()) {
        // The prompt is computed: the prefill worker's queue is shorter by
        // it from now on (its KV transfer runs beside the next prefills).
        admission_->MarkPrefillDone(flight->admission);
        admission_->ObserveTtft(flight->admission, absl::Now() - flight->admitted);
        for (int i = 0; i < p.first_token().token_ids_size(); ++i) {
          emit(EventFrom(r.id, p.first_token(), i, outputs++));
        }
      } else if (p.has_transfer_done()) {
        transfer_done = absl::Now();
        flight->observer->OnPrefillDone();
      } else if (p.has_complete()) {
        // The first token ended the request.
        engine::TokenEvent end;
        end.request_id = r.id;
        end.output_index = outputs;
        end.finish = worker::FinishReasonFromProto(p.complete().finish_reason());
        if (p.complete().has_stop_token_id()) end.matched_stop_token = p.complete().stop_token_id();
        emit(end);
      }
    }
    const grpc::Status prefill_status = prefill_reader->Finish();
    if (!prefill_status.ok()) decode_context.TryCancel();
    flight->observer->OnPrefillDone();
    while (true) {
      v1::DecodeResponse d;
      {
        absl::MutexLock lock(&stream.mu);
        auto ready = [&stream]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(stream.mu) {
          return stream.ended || !stream.responses.empty();
        };
        stream.mu.Await(absl::Condition(&ready));
        if (stream.responses.empty()) break;
        d = std::move(stream.responses.front());
        stream.responses.pop_front();
      }
      if (!prefill_status.ok()) continue;  // Drained, not emitted.
      if (d.has_chunk()) {
        for (int i = 0; i < d.chunk().token_ids_size(); ++i) {
          emit(EventFrom(r.id, d.chunk(), i, outputs++));
        }
      } else if (d.has_complete()) {
        engine::TokenEvent end;
        end.request_id = r.id;
        end.output_index = outputs;
        end.finish = worker::FinishReasonFromProto(d.complete().finish_reason());
        if (d.complete().has_stop_token_id()) end.matched_stop_token = d.complete().stop_token_id();
        emit(end);
      }
    }
    decode_thread.join();
    grpc::Status decode_status;
    {
      absl::MutexLock lock(&stream.mu);
      decode_status = stream.status;
    }
    // Report the call that failed first: a decode failure cancels the
    // prefill call, and a prefill failure the decode call.
    const bool decode_failed_first = !decode_status.ok() &&
                                     decode_status.error_code() != grpc::StatusCode::CANCELLED &&
                                     prefill_status.error_code() == grpc::StatusCode::CANCELLED;
    if (!prefill_status.ok() && !decode_failed_first) {
      fail(absl::StrCat("Prefill on ", flight->prefill_address, ": ",
                        prefill_status.error_message()));
    } else if (!decode_status.ok()) {
      fail(absl::StrCat("Decode on ", flight->decode_address, ": ", decode_status.error_message()));
    }
    {
      absl::MutexLock lock(&flight->mu);
      flight->decode_context = nullptr;
      flight->prefill_context = nullptr;
    }
    if (!finished) fail("the decode stream ended without a completion");
  }
  if (outputs >= 2) {
    // The client's TPOT: the mean gap after the first token.
    admission_->ObserveTpot(flight->admission, (last_token - first_token) / (outputs - 1));
  }
  admission_->Release(flight->admission);
  if (TRIDENT_LOG_IS_ON(DEBUG) && outputs > 0) {
    // Predictions against outcomes, as the router sees them (client-side
    // latencies add the router's own streaming).
    auto ms = [](absl::Duration d) { return absl::ToDoubleMilliseconds(d); };
    TRIDENT_LOG(DEBUG) << "request " << r.id << " prefill " << flight->prefill_address << " decode "
                       << flight->decode_address << " prompt " << r.prompt.size() << " outputs "
                       << outputs << ": predicted ttft_ms " << ms(flight->predicted_ttft)
                       << " tpot_ms " << ms(flight->predicted_tpot) << "; actual ttft_ms "
                       << ms(first_token - flight->admitted) << " transfer_done_ms "
                       << ms(transfer_done - flight->admitted) << " second_token_ms "
                       << ms(second_token - flight->admitted) << " tpot_ms "
                       << (outputs > 1 ? ms(last_token - first_token) / (outputs - 1) : 0.0)
                       << " decode_tpot_ms "
                       << (outputs > 2 ? ms(last_token - second_token) / (outputs - 2) : 0.0)
                       << " thread_start_ms " << ms(started - flight->admitted) << " reserved_ms "
                       << ms(reserved_at - flight->admitted) << " prefill_started_ms "
                       << ms(prefill_started - flight->admitted);
  }
  absl::MutexLock lock(&mu_);
  flights_.erase(r.id);
  --running_threads_;
}

}  // namespace trident::router
