#include "services/router/flight.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/frontend/request_proto.h"
#include "common/grpc/status.h"
#include "common/logging/log.h"
#include "common/time/proto_time.h"
#include "services/router/migration.h"

namespace trident::router {
namespace {

namespace v1 = ::trident::v1;

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

std::chrono::system_clock::time_point DeadlineIn(absl::Duration timeout) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout);
}

void RunAll(std::vector<std::function<void()>>& calls) {
  for (auto& call : calls) call();
  calls.clear();
}

}  // namespace

Flight::Flight(FlightOwner* owner, admission::AdmissionController* admission,
               const RemoteTokenSourceOptions* options, const Clock* clock,
               engine::EngineRequest request, engine::TokenCallback callback, absl::Time arrival)
    : owner_(owner),
      admission_(admission),
      options_(options),
      clock_(clock),
      request_(std::move(request)),
      callback_(std::move(callback)),
      arrival_(arrival) {}

Flight::~Flight() = default;

admission::AdmissionRequest Flight::AdmissionAsk() const {
  absl::MutexLock lock(&mu_);
  admission::AdmissionRequest ask;
  ask.prompt_tokens = static_cast<int64_t>(request_.prompt.size() + streamed_.size());
  ask.max_output_tokens = request_.max_tokens - static_cast<int64_t>(streamed_.size());
  ask.qos_class = request_.qos_class;
  ask.ttft = request_.ttft_slo;
  ask.tpot = request_.tpot_slo;
  ask.must_admit = migrations_ > 0;
  ask.excluded_workers = failed_workers_;
  if (options_->kv_index != nullptr) {
    kv_index::KvIndex::PrefixMatch match;
    if (streamed_.empty()) {
      match = options_->kv_index->Match(request_.prompt, request_.cache_salt);
    } else {
      std::vector<int32_t> tokens = request_.prompt;
      tokens.insert(tokens.end(), streamed_.begin(), streamed_.end());
      match = options_->kv_index->Match(tokens, request_.cache_salt);
    }
    ask.cached_tokens = std::move(match.gpu);
    ask.dram_cached_tokens = std::move(match.dram);
  }
  return ask;
}

bool Flight::migrating() const {
  absl::MutexLock lock(&mu_);
  return migrations_ > 0;
}

absl::Status Flight::migration_cause() const {
  absl::MutexLock lock(&mu_);
  return last_migration_.has_value() ? last_migration_->cause : absl::OkStatus();
}

absl::Time Flight::WaitLimit(const admission::AdmissionDecision& decision) const {
  absl::MutexLock lock(&mu_);
  absl::Duration limit = options_->max_kv_wait;
  absl::Time from = arrival_;
  if (migrations_ > 0) {
    from = last_migration_->at;
    limit = options_->migration_wait;
  } else if (decision.ttft_target.has_value()) {
    limit = std::min(limit, *decision.ttft_target);
  }
  absl::Time until = from + limit;
  if (request_.time_limit.has_value()) until = std::min(until, arrival_ + *request_.time_limit);
  return until;
}

bool Flight::aborted() const {
  absl::MutexLock lock(&mu_);
  return aborted_;
}

void Flight::Reserve(FlightRoute route) {
  std::shared_ptr<Flight> self = shared_from_this();
  v1::Decode::Stub* stub = route.decode_stubs->decode.get();
  Attempt* a;
  bool proceed;
  {
    absl::MutexLock lock(&mu_);
    if (attempt_ != nullptr) retired_.push_back(std::move(attempt_));  // a KV wait's try
    attempt_ = std::make_unique<Attempt>();
    a = attempt_.get();
    a->route = std::move(route);
    a->admitted_at = clock_->Now();
    if (last_migration_.has_value() && !last_migration_->routed) {
      // A migration found its new pair.
      last_migration_->routed = true;
      CountMigrationLocked(MigrationOutcome::kResumed, last_migration_->stalled);
    }
    if (observer_ == nullptr) {
      // Admitted and routed: from now on the request counts in flight.
      observer_ = std::make_unique<RequestObserver>(options_->metrics, clock_,
                                                    request_.qos_class, arrival_);
    }
    proceed = !aborted_;
    if (!proceed) {
      EndLocked(absl::OkStatus());
      SettleLocked();
    } else if (!a->route.colocated) {
      v1::ReserveKvRequest& r = a->reserve_request;
      const int32_t tokens = static_cast<int32_t>(request_.prompt.size() + streamed_.size());
      r.set_request_id(AttemptRequestId(request_.id, migrations_ + 1));
      r.set_num_tokens(tokens);
      r.set_max_total_tokens(static_cast<int32_t>(request_.prompt.size()) + request_.max_tokens);
      SetProtoDuration(options_->reserve_lease, r.mutable_lease());
      r.set_qos_class(request_.qos_class);
      r.set_allow_cpu_attention(options_->allow_cpu_attention);
      // The decode worker reserves only what its prefix cache lacks.
      for (int32_t t : request_.prompt) r.add_prompt_token_ids(t);
      for (int32_t t : streamed_) r.add_prompt_token_ids(t);
      r.set_cache_salt(request_.cache_salt);
      a->reserve_context = std::make_unique<grpc::ClientContext>();
      a->reserve_context->set_deadline(DeadlineIn(options_->reserve_timeout));
      ++a->open_calls;
    }
  }
  if (!proceed) {
    DeliverOutbox();
    return;
  }
  if (a->route.colocated) {
    // One worker without a KV transport computes the prompt and decodes it.
    StartStreams(v1::KvDestination());
    return;
  }
  stub->async()->ReserveKv(a->reserve_context.get(), &a->reserve_request, &a->reserve_response,
                           [self](grpc::Status status) mutable {
                             if (!self->OnReserved(status)) {
                               self->owner_->WaitForKv(self, FromGrpcStatus(status));
                             }
                             // The flight (and the call's context with it)
                             // may end here, inside the callback; never as
                             // gRPC destroys the callback object with the
                             // call, where the context's unref would come
                             // twice.
                             self.reset();
                           });
}

bool Flight::OnReserved(const grpc::Status& status) {
  std::shared_ptr<Flight> self = shared_from_this();
  bool start = false;
  bool done = false;
  bool migrate = false;
  v1::KvDestination destination;
  {
    absl::MutexLock lock(&mu_);
    Attempt& a = *attempt_;
    --a.open_calls;
    a.reserved_at = clock_->Now();
    a.reserve_request.Clear();
    destination = a.reserve_response.destination();
    if (aborted_) {
      if (status.ok()) {
        ReleaseReservation(a.route.decode_stubs->decode.get(), destination,
                           "the request was aborted");
      }
      EndLocked(absl::OkStatus());
      SettleLocked();
      done = true;
    } else if (status.ok()) {
      start = true;
      a.reserved = destination;
    } else if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      // The KV cache is full: the admission slot goes back while the
      // request waits, and the retry is admitted afresh.
      ReleaseAdmissionLocked();
      return false;
    } else {
      a.failure = WorkerStatus("ReserveKv", a.route.decode_address, status);
      a.failed_worker = a.route.decode_id;
      migrate = ConcludeLocked();
      done = !migrate;
    }
  }
  if (start) StartStreams(destination);
  if (migrate) owner_->Migrate(self);
  if (done) DeliverOutbox();
  return true;
}

void Flight::SetWaiting(bool waiting) {
  absl::MutexLock lock(&mu_);
  if (observer_ != nullptr) observer_->OnKvWait(waiting);
}

void Flight::EndWithoutCalls(const absl::Status& status,
                             absl::optional<admission::RejectReason> rejected,
                             absl::optional<MigrationOutcome> migration) {
  std::shared_ptr<Flight> self = shared_from_this();
  {
    absl::MutexLock lock(&mu_);
    if (rejected.has_value() && observer_ != nullptr) observer_->OnRejected(*rejected);
    if (migration.has_value()) {
      CountMigrationLocked(*migration, last_migration_.has_value() && last_migration_->stalled);
    }
    EndLocked(status);
    SettleLocked();
  }
  DeliverOutbox();
}

void Flight::StartStreams(const v1::KvDestination& reserved) {
  PrefillStream* prefill;
  DecodeStream* decode;
  FlightRoute route;
  {
    absl::MutexLock lock(&mu_);
    Attempt& a = *attempt_;
    route = a.route;
    v1::KvDestination destination = reserved;
    if (destination.decode_address().empty()) destination.set_decode_address(route.decode_address);
    AttemptRequests requests =
        BuildAttemptRequests(request_, migrations_ + 1, streamed_, destination,
                             clock_->Now() - arrival_);
    StreamEvents* events = this;
    a.decode =
        std::make_unique<DecodeStream>(events, std::move(requests.decode), options_->call_timeout);
    decode = a.decode.get();
    ++a.open_calls;
    if (a.route.colocated) {
      // The Decode stream (reservation 0) brings the first token too.
      a.first_emitted = true;
      prefill = nullptr;
    } else {
      a.prefill = std::make_unique<PrefillStream>(events, std::move(requests.prefill),
                                                  options_->call_timeout);
      prefill = a.prefill.get();
      ++a.open_calls;
    }
  }
  // Decode first: it waits for the hand-off the prefill makes.
  decode->Start(route.decode_stubs->decode.get());
  if (prefill != nullptr) prefill->Start(route.prefill_stubs->prefill.get());
}

void Flight::OnPrefillMessage(const v1::PrefillResponse& p) {
  std::vector<std::function<void()>> cancels;
  {
    absl::MutexLock lock(&mu_);
    HandlePrefillLocked(p);
    cancels.swap(cancels_);
  }
  RunAll(cancels);
  DeliverOutbox();
}

void Flight::HandlePrefillLocked(const v1::PrefillResponse& p) {
  Attempt& a = *attempt_;
  const absl::Time now = clock_->Now();
  if (p.has_started()) {
    prefill_queued_ = (a.reserved_at - arrival_) + DurationFromProto(p.started().queued());
  } else if (p.has_first_token()) {
    prefill_cached_tokens_ = p.cached_tokens();
    prefill_dram_cached_tokens_ = p.dram_cached_tokens();
    // The prompt is computed: the prefill worker's queue is shorter by it
    // from now on (its KV transfer runs beside the next prefills).
    admission_->MarkPrefillDone(a.route.admission);
    if (migrations_ == 0) admission_->ObserveTtft(a.route.admission, now - a.admitted_at);
    EmitChunkLocked(p.first_token());
    a.first_emitted = true;
    while (!a.held_decode.empty()) {
      HandleDecodeLocked(a.held_decode.front());
      a.held_decode.pop_front();
    }
  } else if (p.has_transfer_done()) {
    transfer_done_at_ = now;
    // The decode worker has the KV: from now on it owes tokens.
    if (!a.watching) a.last_progress = now;
    a.watching = true;
    prefill_time_ = DurationFromProto(p.transfer_done().prefill_time());
    transfer_time_ = DurationFromProto(p.transfer_done().transfer_time());
    if (observer_ != nullptr) observer_->OnPrefillDone();
  } else if (p.has_complete()) {
    // The first token ended the request.
    EmitCompleteLocked(p.complete());
  }
}

void Flight::OnDecodeMessage(v1::DecodeResponse d) {
  std::vector<std::function<void()>> cancels;
  {
    absl::MutexLock lock(&mu_);
    Attempt& a = *attempt_;
    if (!a.first_emitted) {
      a.held_decode.push_back(std::move(d));
      return;
    }
    HandleDecodeLocked(d);
    cancels.swap(cancels_);
  }
  RunAll(cancels);
  DeliverOutbox();
}

void Flight::HandleDecodeLocked(const v1::DecodeResponse& d) {
  Attempt& a = *attempt_;
  if (d.has_chunk()) {
    const absl::Time now = clock_->Now();
    if (a.route.colocated && !a.watching) {
      // A colocated attempt's first token: the prompt is computed.
      admission_->MarkPrefillDone(a.route.admission);
      if (migrations_ == 0) admission_->ObserveTtft(a.route.admission, now - a.admitted_at);
      if (observer_ != nullptr) observer_->OnPrefillDone();
    }
    a.watching = true;
    a.last_progress = now;
    EmitChunkLocked(d.chunk());
    return;
  }
  if (!d.has_complete()) return;
  const v1::GenerateComplete& complete = d.complete();
  const auto code = static_cast<absl::StatusCode>(complete.error_code());
  if (complete.finish_reason() == v1::FINISH_REASON_ERROR && IsMigratable(code)) {
    // The worker gave the request up (e.g. it lost its attention service):
    // as if its stream had broken.
    if (a.failure.ok()) {
      FailLocked(absl::Status(code, absl::StrCat("Decode on ", a.route.decode_address, ": ",
                                                 complete.error_message())),
                 a.route.decode_id);
    }
    return;
  }
  // The completion waits for the prefill stream's end, which brings the
  // transfer's timings for the placement.
  if (a.prefill != nullptr && !a.prefill_done) {
    a.held_complete = complete;
  } else {
    EmitCompleteLocked(complete);
  }
}

void Flight::FailLocked(const absl::Status& status, const std::string& worker) {
  Attempt& a = *attempt_;
  a.failure = status;
  a.failed_worker = worker;
  // The other call is cancelled, and its worker frees the sequence's KV.
  if (a.prefill != nullptr) {
    PrefillStream* prefill = a.prefill.get();
    cancels_.push_back([prefill] { prefill->Cancel(); });
  }
  if (a.decode != nullptr) {
    DecodeStream* decode = a.decode.get();
    cancels_.push_back([decode] { decode->Cancel(); });
  }
}

void Flight::OnCallDone(Call call, const grpc::Status& status) {
  // Callbacks may hold the last other reference; the flight ends here.
  std::shared_ptr<Flight> self = shared_from_this();
  std::vector<std::function<void()>> cancels;
  bool migrate = false;
  {
    absl::MutexLock lock(&mu_);
    Attempt& a = *attempt_;
    --a.open_calls;
    if (!status.ok() && a.failure.ok() && !aborted_ && !finished_ &&
        status.error_code() != grpc::StatusCode::CANCELLED) {
      if (call == Call::kPrefill) {
        FailLocked(WorkerStatus("Prefill", a.route.prefill_address, status), a.route.prefill_id);
      } else {
        FailLocked(WorkerStatus("Decode", a.route.decode_address, status), a.route.decode_id);
      }
    }
    if (call == Call::kPrefill) {
      if (observer_ != nullptr) observer_->OnPrefillDone();
      a.prefill_done = true;
      if (!a.watching) a.last_progress = clock_->Now();
      a.watching = true;
      // The decode worker finished the request: that stands whatever
      // became of the prefill stream since.
      if (a.held_complete.has_value()) EmitCompleteLocked(*a.held_complete);
    }
    if (a.open_calls == 0) migrate = ConcludeLocked();
    cancels.swap(cancels_);
  }
  RunAll(cancels);
  if (migrate) owner_->Migrate(self);
  DeliverOutbox();
}

absl::optional<Flight::Progress> Flight::WatchedProgress() const {
  absl::MutexLock lock(&mu_);
  if (attempt_ == nullptr || finished_ || aborted_) return absl::nullopt;
  const Attempt& a = *attempt_;
  if (a.decode == nullptr || a.open_calls == 0 || !a.failure.ok() || !a.watching) {
    return absl::nullopt;
  }
  return Progress{a.route.decode_id, a.last_progress};
}

bool Flight::CheckProgress(absl::Time now,
                           const absl::flat_hash_map<std::string, absl::Time>& worker_progress) {
  const absl::Duration timeout = options_->stall_timeout;
  if (timeout <= absl::ZeroDuration() || timeout == absl::InfiniteDuration()) return false;
  std::vector<std::function<void()>> cancels;
  {
    absl::MutexLock lock(&mu_);
    if (attempt_ == nullptr || finished_ || aborted_) return false;
    Attempt& a = *attempt_;
    if (a.decode == nullptr || a.open_calls == 0 || !a.failure.ok() || !a.watching) return false;
    absl::Time last = a.last_progress;
    if (auto it = worker_progress.find(a.route.decode_id); it != worker_progress.end()) {
      last = std::max(last, it->second);
    }
    if (now - last < timeout) return false;
    a.stalled = true;
    FailLocked(absl::UnavailableError(absl::StrCat(
                   "Decode on ", a.route.decode_address, ": no token for ",
                   absl::FormatDuration(now - last), " from any of its streams (the worker stalled)")),
               a.route.decode_id);
    cancels.swap(cancels_);
  }
  RunAll(cancels);
  return true;
}

bool Flight::ConcludeLocked() {
  Attempt& a = *attempt_;
  if (a.reserved.has_value() && (aborted_ || !a.failure.ok())) {
    // The Decode call that would have used the reservation failed or was
    // cancelled, perhaps before it reached the worker: free it now rather
    // than when its lease ends. (A no-op where the call already did.)
    ReleaseReservation(a.route.decode_stubs->decode.get(), *a.reserved,
                       aborted_ ? "the request was aborted" : "the request's attempt failed");
    a.reserved.reset();
  }
  if (!finished_ && !aborted_ && !a.failure.ok() && IsMigratable(a.failure.code())) {
    if (absl::optional<engine::FinishReason> reason = EndedByItsTokensLocked()) {
      // Nothing is left to generate: the request ends as it would have.
      engine::TokenEvent end;
      end.request_id = request_.id;
      end.output_index = static_cast<int32_t>(streamed_.size());
      end.finish = *reason;
      if (*reason == engine::FinishReason::kStop) end.matched_stop_token = streamed_.back();
      end.placement = PlacementLocked();
      EmitLocked(std::move(end));
    } else if (migrations_ < options_->migration_limit) {
      ReleaseAdmissionLocked();
      // A worker that answered ABORTED is alive and gave the request up
      // (often for its peer: a transfer to a dead decode worker); only an
      // unreachable or stalled one is kept out of the retry.
      if (a.failure.code() != absl::StatusCode::kAborted) failed_workers_.insert(a.failed_worker);
      ++migrations_;
      last_migration_ = Migration{.at = clock_->Now(), .cause = a.failure, .stalled = a.stalled};
      TRIDENT_LOG(WARNING) << "request " << request_.id << ": " << a.failure << "; migrating ("
                           << migrations_ << " of at most " << options_->migration_limit
                           << ") with " << streamed_.size() << " tokens streamed";
      retired_.push_back(std::move(attempt_));
      return true;
    } else {
      CountMigrationLocked(MigrationOutcome::kLimitReached, a.stalled);
      a.failure = absl::Status(a.failure.code(),
                               absl::StrCat(a.failure.message(), " (migration limit of ",
                                            options_->migration_limit, " reached)"));
    }
  }
  if (!finished_) {
    EndLocked(aborted_ || !a.failure.ok()
                  ? a.failure
                  : absl::InternalError("the decode stream ended without a completion"));
  }
  SettleLocked();
  return false;
}

absl::optional<engine::FinishReason> Flight::EndedByItsTokensLocked() const {
  if (static_cast<int32_t>(streamed_.size()) >= request_.max_tokens) {
    return engine::FinishReason::kLength;
  }
  if (!streamed_.empty() &&
      std::find(request_.stop_token_ids.begin(), request_.stop_token_ids.end(),
                streamed_.back()) != request_.stop_token_ids.end()) {
    return engine::FinishReason::kStop;
  }
  return absl::nullopt;
}

void Flight::Abort() {
  std::vector<std::function<void()>> cancels;
  {
    absl::MutexLock lock(&mu_);
    if (finished_ || aborted_) return;
    aborted_ = true;
    if (attempt_ != nullptr) {
      if (attempt_->reserve_context != nullptr) {
        grpc::ClientContext* context = attempt_->reserve_context.get();
        cancels.push_back([context] { context->TryCancel(); });
      }
      if (attempt_->prefill != nullptr) {
        PrefillStream* prefill = attempt_->prefill.get();
        cancels.push_back([prefill] { prefill->Cancel(); });
      }
      if (attempt_->decode != nullptr) {
        DecodeStream* decode = attempt_->decode.get();
        cancels.push_back([decode] { decode->Cancel(); });
      }
    }
  }
  RunAll(cancels);
}

void Flight::EmitChunkLocked(const v1::TokenChunk& chunk) {
  for (int i = 0; i < chunk.token_ids_size(); ++i) {
    EmitLocked(EventFrom(request_.id, chunk, i, static_cast<int32_t>(streamed_.size())));
  }
}

void Flight::EmitCompleteLocked(const v1::GenerateComplete& complete) {
  engine::TokenEvent end;
  end.request_id = request_.id;
  end.output_index = static_cast<int32_t>(streamed_.size());
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
  if (options_->metrics != nullptr && end.cached_tokens > 0) {
    options_->metrics->OnCachedTokensDelivered(end.cached_tokens);
  }
  EmitLocked(std::move(end));
}

void Flight::EmitLocked(engine::TokenEvent ev) {
  if (finished_) return;
  if (ev.token >= 0) {
    const absl::Time now = clock_->Now();
    if (streamed_.empty()) first_token_at_ = now;
    last_token_at_ = now;
    streamed_.push_back(ev.token);
  }
  finished_ = ev.finish != engine::FinishReason::kNone;
  if (observer_ != nullptr) {
    if (ev.token >= 0 && !finished_) observer_->OnToken();
    if (finished_) observer_->OnFinish(ev.finish);
  }
  outbox_.push_back(std::move(ev));
}

void Flight::DeliverOutbox() {
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
  if (report) owner_->OnFlightDone(*this);
}

void Flight::EndLocked(const absl::Status& status) {
  if (finished_) return;
  if (!aborted_ && !status.ok()) {
    TRIDENT_LOG(WARNING) << "request " << request_.id << ": " << status;
  }
  engine::TokenEvent ev;
  ev.request_id = request_.id;
  ev.output_index = static_cast<int32_t>(streamed_.size());
  ev.finish =
      aborted_ || status.ok() ? engine::FinishReason::kAborted : engine::FinishReason::kError;
  if (ev.finish == engine::FinishReason::kError) ev.error = status;
  ev.placement = PlacementLocked();
  EmitLocked(std::move(ev));
}

const Flight::Attempt* Flight::LatestLocked() const {
  if (attempt_ != nullptr) return attempt_.get();
  return retired_.empty() ? nullptr : retired_.back().get();
}

engine::RequestPlacement Flight::PlacementLocked() const {
  engine::RequestPlacement p;
  if (const Attempt* a = LatestLocked(); a != nullptr) {
    p.prefill_worker_id = a->route.prefill_id;
    p.decode_worker_id = a->route.decode_id;
  }
  p.queued = prefill_queued_;
  p.prefill = prefill_time_;
  p.kv_transfer = transfer_time_;
  return p;
}

void Flight::ReleaseAdmissionLocked() {
  if (attempt_ == nullptr || attempt_->route.admission == 0) return;
  const int64_t outputs = static_cast<int64_t>(streamed_.size());
  if (outputs >= 2 && migrations_ == 0) {
    // The client's TPOT: the mean gap after the first token.
    admission_->ObserveTpot(attempt_->route.admission,
                            (last_token_at_ - first_token_at_) / (outputs - 1));
  }
  admission_->Release(attempt_->route.admission);
  attempt_->route.admission = 0;
}

void Flight::CountMigrationLocked(MigrationOutcome outcome, bool stalled) {
  if (options_->metrics != nullptr) options_->metrics->OnMigration(outcome, stalled);
}

void Flight::SettleLocked() {
  settled_ = true;
  ReleaseAdmissionLocked();
  const Attempt* a = LatestLocked();
  if (!TRIDENT_LOG_IS_ON(DEBUG) || streamed_.empty() || a == nullptr) return;
  // Predictions against outcomes, as the router sees them (client-side
  // latencies add the router's own streaming).
  const absl::Time admitted = a->admitted_at;
  auto ms = [admitted](absl::Time t) { return absl::ToDoubleMilliseconds(t - admitted); };
  const int64_t outputs = static_cast<int64_t>(streamed_.size());
  TRIDENT_LOG(DEBUG) << "request " << request_.id << " prefill " << a->route.prefill_address
                     << " decode " << a->route.decode_address << " prompt "
                     << request_.prompt.size() << " outputs " << outputs << " migrations "
                     << migrations_ << ": predicted ttft_ms "
                     << absl::ToDoubleMilliseconds(a->route.predicted_ttft) << " tpot_ms "
                     << absl::ToDoubleMilliseconds(a->route.predicted_tpot) << "; actual ttft_ms "
                     << ms(first_token_at_) << " transfer_done_ms " << ms(transfer_done_at_)
                     << " tpot_ms "
                     << (outputs > 1 ? absl::ToDoubleMilliseconds(last_token_at_ - first_token_at_) /
                                           static_cast<double>(outputs - 1)
                                     : 0.0)
                     << " reserved_ms " << ms(a->reserved_at);
}

}  // namespace trident::router
