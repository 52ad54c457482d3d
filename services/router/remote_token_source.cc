#include "services/router/remote_token_source.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/status/error_details.h"

namespace trident::router {

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

WorkerStubs* RemoteTokenSource::StubsFor(const std::string& address) {
  auto& stubs = stubs_[address];
  if (stubs == nullptr) stubs = NewWorkerStubs(address, options_);
  return stubs.get();
}

absl::Status RemoteTokenSource::Submit(engine::EngineRequest request,
                                       engine::TokenCallback callback) {
  const std::string id = request.id;
  const std::string qos_class = request.qos_class;
  FlightOwner* owner = this;
  auto flight = std::make_shared<Flight>(owner, admission_, &options_, clock_, std::move(request),
                                         std::move(callback), clock_->Now());
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
  absl::Status routed = Route(flight, RouteKind::kFirst, &no_room);
  if (!routed.ok()) {
    absl::MutexLock lock(&mu_);
    flights_.erase(id);
  }
  return routed;
}

absl::Status RemoteTokenSource::Route(const std::shared_ptr<Flight>& flight, RouteKind kind,
                                      bool* no_room) {
  RouterMetrics* const metrics = options_.metrics;
  const bool first_attempt = kind == RouteKind::kFirst;
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
  } else if (!decision->admitted) {
    if (ask.must_admit) {
      // A migration finds no worker (admission refuses it nothing else):
      // it waits for one to come (a restart, a role change).
      *no_room = true;
      return absl::UnavailableError(absl::StrCat(
          "no worker is left to take the request over (", ask.excluded_workers.size(),
          " failed under it)"));
    }
    // Still no KV room anywhere: keep waiting. Any other reason ends the
    // wait with admission's answer.
    *no_room = decision->reason == admission::RejectReason::kKvCapacity;
    return admission::RejectionStatus(*decision);
  }
  if (kind != RouteKind::kKvRetry) {
    const absl::Time limit = flight->WaitLimit(*decision);
    absl::MutexLock lock(&mu_);
    flight->wait_limit = limit;
  }
  FlightRoute route;
  route.admission = decision->id;
  route.decode_id = std::string(decision->decode_worker_id);
  route.prefill_id = std::string(decision->prefill_worker_id);
  route.colocated = decision->colocated;
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

void RemoteTokenSource::Migrate(const std::shared_ptr<Flight>& flight) {
  bool stopping;
  {
    absl::MutexLock lock(&mu_);
    stopping = stopping_;
  }
  if (stopping || flight->aborted()) {
    flight->EndWithoutCalls(absl::OkStatus(), absl::nullopt);
    return;
  }
  bool no_room = false;
  const absl::Status routed = Route(flight, RouteKind::kMigration, &no_room);
  if (routed.ok()) return;
  if (!no_room) {
    flight->EndWithoutCalls(routed, absl::nullopt, MigrationOutcome::kNoWorker);
    return;
  }
  // It waits for a worker as for KV room, until migration_wait.
  const absl::Time limit = flight->WaitLimit(admission::AdmissionDecision());
  {
    absl::MutexLock lock(&mu_);
    flight->wait_limit = limit;
  }
  WaitForKv(flight, routed);
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
  if (flight->migrating()) {
    flight->EndWithoutCalls(
        absl::UnavailableError(absl::StrCat(
            flight->migration_cause().message(), "; no worker could take the request over within ",
            absl::FormatDuration(options_.migration_wait), " (", why.message(), ")")),
        absl::nullopt, MigrationOutcome::kNoWorker);
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
  std::vector<std::shared_ptr<Flight>> in_flight;
  const absl::Time now = clock_->Now();
  {
    absl::MutexLock lock(&mu_);
    if (options_.stall_timeout > absl::ZeroDuration() &&
        options_.stall_timeout != absl::InfiniteDuration()) {
      in_flight.reserve(flights_.size());
      for (const auto& [id, flight] : flights_) in_flight.push_back(flight);
    }
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
  // The watchdog judges a decode worker by all its streams.
  absl::flat_hash_map<std::string, absl::Time> worker_progress;
  for (const std::shared_ptr<Flight>& flight : in_flight) {
    if (absl::optional<Flight::Progress> p = flight->WatchedProgress()) {
      auto [it, inserted] = worker_progress.try_emplace(p->decode_id, p->at);
      if (!inserted) it->second = std::max(it->second, p->at);
    }
  }
  for (const std::shared_ptr<Flight>& flight : in_flight) flight->CheckProgress(now, worker_progress);
  for (const Due& d : due) {
    d.flight->SetWaiting(false);
    if (d.expired) {
      WaitForKv(d.flight, d.flight->migrating()
                              ? absl::UnavailableError("no worker came")
                              : absl::ResourceExhaustedError("the KV cache stayed full"));
      continue;
    }
    bool no_room = false;
    const absl::Status routed = Route(d.flight, RouteKind::kKvRetry, &no_room);
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

void RemoteTokenSource::AwaitIdleForTesting() const {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return flights_.empty(); };
  mu_.Await(absl::Condition(&idle));
}

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
