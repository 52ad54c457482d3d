#include "services/router/router_metrics.h"

#include <utility>

namespace trident::router {
namespace {

constexpr absl::string_view kUnknownClass = "unknown";

constexpr std::array<admission::RejectReason, 5> kReasons = {
    admission::RejectReason::kTtft, admission::RejectReason::kTpot,
    admission::RejectReason::kKvCapacity, admission::RejectReason::kNoWorkers,
    admission::RejectReason::kClassCapacity};

constexpr std::array<RequestOutcome, 4> kOutcomes = {RequestOutcome::kOk, RequestOutcome::kRejected,
                                                     RequestOutcome::kCancelled,
                                                     RequestOutcome::kError};

// Predictions: 1 ms to 2 minutes covers both TTFT and TPOT targets.
std::vector<double> PredictionBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
}

std::string Name(absl::string_view s) { return std::string(s); }

}  // namespace

absl::string_view RequestOutcomeName(RequestOutcome outcome) {
  switch (outcome) {
    case RequestOutcome::kOk:
      return "ok";
    case RequestOutcome::kRejected:
      return "rejected";
    case RequestOutcome::kCancelled:
      return "cancelled";
    case RequestOutcome::kError:
      return "error";
  }
  return "error";
}

std::vector<double> TtftBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
          1,     1.5,  2,     3,    5,     7.5, 10,   20,  30,  60,  120};
}

std::vector<double> TpotBuckets() {
  return {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05,
          0.075, 0.1,    0.15,  0.2,    0.3,  0.5,   0.75, 1,    2.5};
}

std::vector<double> E2eBuckets() {
  return {0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 60, 90, 120, 300, 600};
}

RouterMetrics::RouterMetrics(prometheus::Registry& r, const admission::QosConfig& qos)
    : qos_(qos),
      worker_queued_prefill_tokens_(
          prometheus::BuildGauge()
              .Name("trident_router_worker_queued_prefill_tokens")
              .Help("Prompt tokens queued for prefill on the worker (its latest load report).")
              .Register(r)),
      worker_running_sequences_(
          prometheus::BuildGauge()
              .Name("trident_router_worker_running_sequences")
              .Help("Sequences in the worker's decode batch (its latest load report).")
              .Register(r)),
      worker_kv_usage_(prometheus::BuildGauge()
                           .Name("trident_router_worker_kv_usage_ratio")
                           .Help("Fraction of the worker's KV blocks not free (its latest load "
                                 "report).")
                           .Register(r)) {
  auto& requests = prometheus::BuildCounter()
                       .Name("trident_router_requests_total")
                       .Help("Requests by QoS class and outcome (ok, rejected, cancelled, error).")
                       .Register(r);
  auto& rejected = prometheus::BuildCounter()
                       .Name("trident_router_requests_rejected_total")
                       .Help("Requests SLO admission rejected, by reason and QoS class.")
                       .Register(r);
  auto& ttft = prometheus::BuildHistogram()
                   .Name("trident_router_ttft_seconds")
                   .Help("Time to first token: arrival at the router to the first output token.")
                   .Register(r);
  auto& tpot = prometheus::BuildHistogram()
                   .Name("trident_router_tpot_seconds")
                   .Help("Mean time per output token after the first, per finished request.")
                   .Register(r);
  auto& itl = prometheus::BuildHistogram()
                  .Name("trident_router_itl_seconds")
                  .Help(
                      "Inter-token latency: the gap between consecutive output tokens of a "
                      "request at the router.")
                  .Register(r);
  auto& e2e = prometheus::BuildHistogram()
                  .Name("trident_router_e2e_seconds")
                  .Help("Arrival at the router to the final event, per finished request.")
                  .Register(r);
  auto& predicted_ttft = prometheus::BuildHistogram()
                             .Name("trident_router_admission_predicted_ttft_seconds")
                             .Help(
                                 "Admission's predicted TTFT for the chosen pair (admitted) or "
                                 "the best candidates (rejected).")
                             .Register(r);
  auto& predicted_tpot = prometheus::BuildHistogram()
                             .Name("trident_router_admission_predicted_tpot_seconds")
                             .Help(
                                 "Admission's predicted TPOT for the chosen pair (admitted) or "
                                 "the best candidates (rejected).")
                             .Register(r);
  auto& in_flight = prometheus::BuildGauge()
                        .Name("trident_router_requests_in_flight")
                        .Help(
                            "Admitted requests not yet ended, by stage (prefill: until the KV "
                            "is handed over; decode: after).")
                        .Register(r);
  in_flight_[static_cast<int>(RequestStage::kPrefill)] = &in_flight.Add({{"stage", "prefill"}});
  in_flight_[static_cast<int>(RequestStage::kDecode)] = &in_flight.Add({{"stage", "decode"}});
  waiting_kv_ = &prometheus::BuildGauge()
                     .Name("trident_router_requests_waiting_kv")
                     .Help(
                         "Admitted requests waiting for KV room on a decode worker whose cache "
                         "was full.")
                     .Register(r)
                     .Add({});

  auto& routing = prometheus::BuildCounter()
                      .Name("trident_router_routing_decisions_total")
                      .Help(
                          "Admitted requests by why their prefill worker won: prefix (predicted "
                          "to hold part of the prompt in its cache) or load.")
                      .Register(r);
  routing_[0] = &routing.Add({{"reason", "prefix"}});
  routing_[1] = &routing.Add({{"reason", "load"}});
  probes_ = &prometheus::BuildCounter()
                 .Name("trident_router_admission_probes_total")
                 .Help(
                     "Requests admitted although their predictions missed their targets, "
                     "because a prefill and a decode worker were idle (models fitted under a "
                     "burst are corrected by their outcomes).")
                 .Register(r)
                 .Add({});
  prefix_predicted_ = &prometheus::BuildCounter()
                           .Name("trident_router_prefix_cache_predicted_tokens_total")
                           .Help(
                               "Prompt tokens admission predicted cached on the chosen prefill "
                               "worker (from the workers' KV events).")
                           .Register(r)
                           .Add({});
  prefix_delivered_ = &prometheus::BuildCounter()
                           .Name("trident_router_prefix_cache_delivered_tokens_total")
                           .Help("Prompt tokens the workers reported reused from their caches.")
                           .Register(r)
                           .Add({});

  RegisterMigrations(r);

  for (const admission::QosClass& c : qos_.classes) class_names_.push_back(c.name);
  class_names_.push_back(Name(kUnknownClass));
  for (const std::string& name : class_names_) {
    PerClass pc;
    for (RequestOutcome o : kOutcomes) {
      pc.outcomes[static_cast<int>(o)] =
          &requests.Add({{"class", name}, {"outcome", Name(RequestOutcomeName(o))}});
    }
    for (admission::RejectReason reason : kReasons) {
      pc.rejected[static_cast<int>(reason)] =
          &rejected.Add({{"class", name}, {"reason", Name(admission::RejectReasonName(reason))}});
    }
    pc.ttft = &ttft.Add({{"class", name}}, TtftBuckets());
    pc.tpot = &tpot.Add({{"class", name}}, TpotBuckets());
    pc.itl = &itl.Add({{"class", name}}, TpotBuckets());
    pc.e2e = &e2e.Add({{"class", name}}, E2eBuckets());
    for (int d = 0; d < 2; ++d) {
      const std::string decision = d == 0 ? "admitted" : "rejected";
      pc.predicted_ttft[d] =
          &predicted_ttft.Add({{"class", name}, {"decision", decision}}, PredictionBuckets());
      pc.predicted_tpot[d] =
          &predicted_tpot.Add({{"class", name}, {"decision", decision}}, PredictionBuckets());
    }
    classes_.push_back(pc);
  }
}

int RouterMetrics::ClassIndex(absl::string_view qos_class) const {
  const int i = qos_.Find(qos_class);
  return i >= 0 ? i : static_cast<int>(classes_.size()) - 1;
}

const std::string& RouterMetrics::ClassLabel(absl::string_view qos_class) const {
  return class_names_[ClassIndex(qos_class)];
}

void RouterMetrics::OnSubmitError(absl::string_view qos_class) {
  classes_[ClassIndex(qos_class)].outcomes[static_cast<int>(RequestOutcome::kError)]->Increment();
}

void RouterMetrics::OnDecision(absl::string_view qos_class,
                               const admission::AdmissionDecision& decision) {
  PerClass& pc = classes_[ClassIndex(qos_class)];
  const int d = decision.admitted ? 0 : 1;
  if (decision.predicted_ttft != absl::InfiniteDuration()) {
    pc.predicted_ttft[d]->Observe(absl::ToDoubleSeconds(decision.predicted_ttft));
  }
  if (decision.predicted_tpot != absl::InfiniteDuration()) {
    pc.predicted_tpot[d]->Observe(absl::ToDoubleSeconds(decision.predicted_tpot));
  }
  if (decision.admitted) {
    if (decision.probe) probes_->Increment();
    routing_[decision.predicted_cached_tokens > 0 ? 0 : 1]->Increment();
    prefix_predicted_->Increment(static_cast<double>(decision.predicted_cached_tokens));
  } else {
    pc.rejected[static_cast<int>(decision.reason)]->Increment();
    pc.outcomes[static_cast<int>(RequestOutcome::kRejected)]->Increment();
  }
}

void RouterMetrics::UpdateWorkerLoad(const admission::WorkerLoadReport& load) {
  const prometheus::Labels labels = {{"worker", load.worker_id}};
  worker_queued_prefill_tokens_.Add(labels).Set(static_cast<double>(load.queued_prefill_tokens));
  worker_running_sequences_.Add(labels).Set(load.running_sequences);
  worker_kv_usage_.Add(labels).Set(load.kv_blocks_total > 0
                                       ? 1.0 - static_cast<double>(load.kv_blocks_free) /
                                                   load.kv_blocks_total
                                       : 0.0);
}

void RouterMetrics::RemoveWorker(const std::string& worker_id) {
  const prometheus::Labels labels = {{"worker", worker_id}};
  for (prometheus::Family<prometheus::Gauge>* family :
       {&worker_queued_prefill_tokens_, &worker_running_sequences_, &worker_kv_usage_}) {
    if (family->Has(labels)) family->Remove(&family->Add(labels));
  }
}

RequestObserver::RequestObserver(RouterMetrics* metrics, const Clock* clock,
                                 absl::string_view qos_class, absl::Time arrival)
    : metrics_(metrics),
      clock_(clock),
      class_index_(metrics != nullptr ? metrics->ClassIndex(qos_class) : 0),
      arrival_(arrival) {
  if (metrics_ != nullptr) {
    metrics_->in_flight_[static_cast<int>(RequestStage::kPrefill)]->Increment();
  }
}

RequestObserver::~RequestObserver() {
  if (!finished_) Finish(RequestOutcome::kError);
}

void RequestObserver::OnToken() {
  if (finished_) return;
  const absl::Time now = clock_->Now();
  if (tokens_ == 0) {
    first_token_ = now;
    if (metrics_ != nullptr) {
      metrics_->classes_[class_index_].ttft->Observe(absl::ToDoubleSeconds(now - arrival_));
    }
  } else if (metrics_ != nullptr) {
    metrics_->classes_[class_index_].itl->Observe(absl::ToDoubleSeconds(now - last_token_));
  }
  last_token_ = now;
  ++tokens_;
}

void RequestObserver::OnPrefillDone() {
  if (finished_ || stage_ == RequestStage::kDecode) return;
  stage_ = RequestStage::kDecode;
  if (metrics_ != nullptr) {
    metrics_->in_flight_[static_cast<int>(RequestStage::kPrefill)]->Decrement();
    metrics_->in_flight_[static_cast<int>(RequestStage::kDecode)]->Increment();
  }
}

void RequestObserver::OnFinish(engine::FinishReason reason) {
  if (finished_) return;
  switch (reason) {
    case engine::FinishReason::kStop:
    case engine::FinishReason::kLength:
      return Finish(RequestOutcome::kOk);
    case engine::FinishReason::kAborted:
      return Finish(RequestOutcome::kCancelled);
    default:
      return Finish(RequestOutcome::kError);
  }
}

void RequestObserver::OnRejected(admission::RejectReason reason) {
  if (finished_) return;
  if (metrics_ != nullptr) {
    metrics_->classes_[class_index_].rejected[static_cast<int>(reason)]->Increment();
  }
  Finish(RequestOutcome::kRejected);
}

void RequestObserver::OnKvWait(bool waiting) {
  if (waiting == waiting_kv_) return;
  waiting_kv_ = waiting;
  if (metrics_ != nullptr) {
    if (waiting) {
      metrics_->waiting_kv_->Increment();
    } else {
      metrics_->waiting_kv_->Decrement();
    }
  }
}

void RequestObserver::Finish(RequestOutcome outcome) {
  OnKvWait(false);
  finished_ = true;
  if (metrics_ == nullptr) return;
  metrics_->in_flight_[static_cast<int>(stage_)]->Decrement();
  RouterMetrics::PerClass& pc = metrics_->classes_[class_index_];
  pc.outcomes[static_cast<int>(outcome)]->Increment();
  if (outcome != RequestOutcome::kOk) return;
  pc.e2e->Observe(absl::ToDoubleSeconds(clock_->Now() - arrival_));
  if (tokens_ >= 2) {
    pc.tpot->Observe(absl::ToDoubleSeconds(last_token_ - first_token_) /
                     static_cast<double>(tokens_ - 1));
  }
}

void RouterMetrics::RegisterMigrations(prometheus::Registry& r) {
  auto& migrations =
      prometheus::BuildCounter()
          .Name("trident_router_migrations_total")
          .Help(
              "Requests whose worker failed mid-request (stream broken, unreachable or "
              "stalled), by outcome: resumed on another worker pair with the tokens streamed "
              "so far, limit_reached (--migration_limit), no_worker (none left to take it).")
          .Register(r);
  for (MigrationOutcome o :
       {MigrationOutcome::kResumed, MigrationOutcome::kLimitReached, MigrationOutcome::kNoWorker}) {
    migrations_[static_cast<int>(o)] =
        &migrations.Add({{"outcome", std::string(MigrationOutcomeName(o))}});
  }
  stalls_ = &prometheus::BuildCounter()
                 .Name("trident_router_worker_stalls_total")
                 .Help(
                     "Worker calls the router ended because no token came within "
                     "--stall_timeout_ms (the worker was alive but made no progress).")
                 .Register(r)
                 .Add({});
}

absl::string_view MigrationOutcomeName(MigrationOutcome outcome) {
  switch (outcome) {
    case MigrationOutcome::kResumed:
      return "resumed";
    case MigrationOutcome::kLimitReached:
      return "limit_reached";
    case MigrationOutcome::kNoWorker:
      return "no_worker";
  }
  return "unknown";
}

void RouterMetrics::OnMigration(MigrationOutcome outcome, bool stalled) {
  migrations_[static_cast<int>(outcome)]->Increment();
  if (stalled) stalls_->Increment();
}

}  // namespace trident::router
