// The router's Prometheus metrics (one struct for the component, registered
// once) and the per-request observer that feeds the latency histograms.
//
// Every metric, its labels and what it means:
//
//   trident_router_requests_total{class, outcome}            counter
//       Requests that reached the router's token source, by QoS class and how
//       they ended: ok (finished: stop or length), rejected (SLO admission
//       refused it; see below), cancelled (the client went away or aborted),
//       error (invalid for admission, no route, or a worker call failed).
//   trident_router_requests_rejected_total{reason, class}    counter
//       Admission rejections, by admission::RejectReasonName (ttft, tpot,
//       kv_capacity, no_workers, class_capacity).
//   trident_router_ttft_seconds{class}                       histogram
//       Time to first token: from the request's arrival at the router's
//       token source (after tokenization) to its first output token arriving
//       at the router (from the prefill worker's stream). Observed for every
//       request that got a first token.
//   trident_router_tpot_seconds{class}                       histogram
//       Time per output token after the first: (last token - first token) /
//       (outputs - 1), one observation per request that finished ok with at
//       least two tokens.
//   trident_router_itl_seconds{class}                        histogram
//       Inter-token latency: the gap between consecutive output tokens of a
//       request as they arrive at the router (tokens arriving in one message
//       have gaps near 0), one observation per token after the first, for
//       every request. TPOT buckets.
//   trident_router_e2e_seconds{class}                        histogram
//       Arrival to the final event, for requests that finished ok.
//   trident_router_requests_in_flight{stage}                 gauge
//       Admitted requests not yet ended: stage "prefill" until the prefill
//       worker reports the KV handed over (or the prefill ends), then
//       "decode". The router's queue depths.
//   trident_router_requests_waiting_kv                       gauge
//       Admitted requests waiting for KV room: their decode worker's cache
//       was full when they asked for a reservation. They wait until room
//       frees or their wait limit passes (then RESOURCE_EXHAUSTED, counted
//       as rejected for reason kv_capacity).
//   trident_router_admission_predicted_ttft_seconds{class, decision}
//   trident_router_admission_predicted_tpot_seconds{class, decision}
//                                                            histograms
//       Admission's predictions for the chosen pair (decision="admitted") or
//       the best candidates (decision="rejected"); not observed when there
//       was no candidate.
//   trident_router_routing_decisions_total{reason}           counter   admitted requests by why
//                                                                      their prefill worker won:
//                                                                      "prefix" (predicted to hold
//                                                                      part of the prompt), "load"
//   trident_router_admission_probes_total                    counter   admitted requests whose
//                                                                      predictions missed their
//                                                                      targets: an idle pair's
//                                                                      probe (AdmissionOptions::
//                                                                      idle_probe_interval)
//   trident_router_prefix_cache_predicted_tokens_total       counter   prompt tokens admission
//                                                                      predicted cached on the
//                                                                      chosen prefill worker
//   trident_router_prefix_cache_delivered_tokens_total       counter   prompt tokens the workers
//                                                                      reported reused (usage
//                                                                      .cached_tokens): a stale
//                                                                      index predicts more
//   trident_router_worker_queued_prefill_tokens{worker}      gauge
//   trident_router_worker_running_sequences{worker}          gauge
//   trident_router_worker_kv_usage_ratio{worker}             gauge
//       From each worker's latest load report (worker = its worker id):
//       prompt tokens queued for prefill, sequences in its decode batch, and
//       the fraction of its KV blocks not free. Removed when the worker's load
//       stream goes down.
//
// The `class` label is the name of a configured QoS class (the default
// class for requests naming none) or "unknown" for a name the config does
// not have, so clients cannot grow the label set.

#ifndef TRIDENT_SERVICES_ROUTER_ROUTER_METRICS_H_
#define TRIDENT_SERVICES_ROUTER_ROUTER_METRICS_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/engine/request.h"
#include "common/time/clock.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/router/admission/admission_controller.h"
#include "services/router/admission/qos_config.h"
#include "services/router/admission/worker_load.h"

namespace trident::router {

// How a request ended (the `outcome` label).
enum class RequestOutcome { kOk, kRejected, kCancelled, kError };

// "ok", "rejected", "cancelled", "error".
absl::string_view RequestOutcomeName(RequestOutcome outcome);

// Where an admitted request is (the `stage` label).
enum class RequestStage { kPrefill, kDecode };

// What became of a request whose worker failed in a way a migration mends
// (the `outcome` label of trident_router_migrations_total): resumed on
// another pair, refused for its migration limit, or no worker left.
enum class MigrationOutcome { kResumed, kLimitReached, kNoWorker };

// "resumed", "limit_reached", "no_worker".
absl::string_view MigrationOutcomeName(MigrationOutcome outcome);

// Histogram buckets, in seconds.
// TTFT: 5 ms to 2 minutes (a queued long prompt).
std::vector<double> TtftBuckets();
// TPOT: 1 ms to 2.5 s per token.
std::vector<double> TpotBuckets();
// End to end: 50 ms to 10 minutes.
std::vector<double> E2eBuckets();

// Thread-safe (prometheus-cpp's metrics are; the rest is immutable after
// construction).
class RouterMetrics {
 public:
  // Registers the families in `registry` (which must outlive this) and
  // creates every per-class series, so that they read 0 before any request.
  RouterMetrics(prometheus::Registry& registry, const admission::QosConfig& qos);

  RouterMetrics(const RouterMetrics&) = delete;
  RouterMetrics& operator=(const RouterMetrics&) = delete;

  // The `class` label for a request's class name: the configured class's
  // name (the default class's for an empty name), or "unknown".
  const std::string& ClassLabel(absl::string_view qos_class) const;

  // A request that failed before it was admitted or routed (invalid for
  // admission, no address for the chosen worker, a duplicate id):
  // requests_total{outcome="error"}.
  void OnSubmitError(absl::string_view qos_class);

  // Admission's decision: the predicted TTFT/TPOT histograms; for a
  // rejection also requests_rejected_total{reason} and
  // requests_total{outcome="rejected"}.
  void OnDecision(absl::string_view qos_class, const admission::AdmissionDecision& decision);

  // The worker gauges from a load report; RemoveWorker drops the worker's
  // series.
  void UpdateWorkerLoad(const admission::WorkerLoadReport& load);
  // A request's prompt tokens its workers reported reused.
  void OnCachedTokensDelivered(int64_t tokens) {
    prefix_delivered_->Increment(static_cast<double>(tokens));
  }
  void RemoveWorker(const std::string& worker_id);
  // A worker call failed in a way a migration mends (the stream broke, the
  // worker was unreachable, or it stalled): what became of the request.
  // `stalled`: the router's progress watchdog ended the call.
  void OnMigration(MigrationOutcome outcome, bool stalled);

 private:
  friend class RequestObserver;
  struct PerClass {
    std::array<prometheus::Counter*, 4> outcomes{};  // By RequestOutcome.
    std::array<prometheus::Counter*, 5> rejected{};  // By admission::RejectReason.
    prometheus::Histogram* ttft = nullptr;
    prometheus::Histogram* tpot = nullptr;
    prometheus::Histogram* itl = nullptr;
    prometheus::Histogram* e2e = nullptr;
    // [0] admitted, [1] rejected.
    std::array<prometheus::Histogram*, 2> predicted_ttft{};
    std::array<prometheus::Histogram*, 2> predicted_tpot{};
  };
  // The migration and stall counters.
  void RegisterMigrations(prometheus::Registry& r);
  // Index into classes_ for a class name (the last entry is "unknown").
  int ClassIndex(absl::string_view qos_class) const;

  const admission::QosConfig qos_;
  std::vector<std::string> class_names_;  // Parallel to classes_.
  std::vector<PerClass> classes_;
  std::array<prometheus::Gauge*, 2> in_flight_{};  // By RequestStage.
  prometheus::Gauge* waiting_kv_ = nullptr;
  // routing_decisions_total: [0] prefix, [1] load.
  std::array<prometheus::Counter*, 2> routing_{};
  prometheus::Counter* probes_ = nullptr;
  prometheus::Counter* prefix_predicted_ = nullptr;
  prometheus::Counter* prefix_delivered_ = nullptr;
  std::array<prometheus::Counter*, 3> migrations_{};  // By MigrationOutcome.
  prometheus::Counter* stalls_ = nullptr;
  prometheus::Family<prometheus::Gauge>& worker_queued_prefill_tokens_;
  prometheus::Family<prometheus::Gauge>& worker_running_sequences_;
  prometheus::Family<prometheus::Gauge>& worker_kv_usage_;
};

// One admitted request's stage and timings. Construct when the request is
// admitted (it counts in stage prefill from then); call the On* methods as
// its events arrive; the first OnFinish records its outcome and latencies,
// and a destruction without one counts as an error. `metrics` may be null
// (nothing is recorded). Thread-compatible: one thread drives it.
class RequestObserver {
 public:
  // `arrival` is when the request reached the router, on `clock`.
  RequestObserver(RouterMetrics* metrics, const Clock* clock, absl::string_view qos_class,
                  absl::Time arrival);
  ~RequestObserver();

  RequestObserver(const RequestObserver&) = delete;
  RequestObserver& operator=(const RequestObserver&) = delete;

  // An output token arrived (the first one observes TTFT, each later one
  // the gap since the previous one: ITL).
  void OnToken();
  // The KV is on the decode worker (or the prefill is over): stage decode.
  void OnPrefillDone();
  // The final event: kStop/kLength end ok, kAborted cancelled, anything
  // else error. Later calls are ignored.
  void OnFinish(engine::FinishReason reason);
  // The request was refused after admission (e.g. it waited for KV room in
  // vain): outcome rejected, and requests_rejected_total{reason}. Later
  // calls, and OnFinish after it, are ignored.
  void OnRejected(admission::RejectReason reason);
  // The request starts (true) or stops (false) waiting for KV room.
  void OnKvWait(bool waiting);

  int64_t tokens() const { return tokens_; }
  RequestStage stage() const { return stage_; }

 private:
  void Finish(RequestOutcome outcome);

  RouterMetrics* const metrics_;
  const Clock* const clock_;
  const int class_index_;
  const absl::Time arrival_;
  RequestStage stage_ = RequestStage::kPrefill;
  bool finished_ = false;
  bool waiting_kv_ = false;
  int64_t tokens_ = 0;
  absl::Time first_token_;
  absl::Time last_token_;
};

}  // namespace trident::router

#endif  // TRIDENT_SERVICES_ROUTER_ROUTER_METRICS_H_
