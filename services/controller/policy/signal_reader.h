#ifndef TRIDENT_SERVICES_CONTROLLER_POLICY_SIGNAL_READER_H_
#define TRIDENT_SERVICES_CONTROLLER_POLICY_SIGNAL_READER_H_

// Reads one interval's ClusterSignals for the role policy from a
// MetricsSource: a handful of instant PromQL queries over the metrics the
// router exports (README, "Metrics"), aggregated per role with the roles the
// controller's membership knows (the metrics carry a `worker` label, not a
// role).
//
//   signal                                query (defaults)                   if no series
//   queued prefill tokens (prefill        max by (worker) of                 kNotFound
//     workers, summed)                    trident_router_worker_queued_prefill_tokens
//   KV usage (decode workers, averaged)   max by (worker) of                 kNotFound
//                                         trident_router_worker_kv_usage_ratio
//   prefill tokens/s of one worker        the highest per-worker rate of     NaN
//                                         trident_worker_prompt_tokens_total
//                                         over the last 15 minutes
//   TTFT p90, TPOT p90                    histogram_quantile(0.9, ...) of    NaN
//                                         trident_router_{ttft,tpot}_seconds
//   rejected ratios                       rate of trident_router_requests_   0
//                                         rejected_total{reason} / rate of
//                                         trident_router_requests_total
//   waiting sequences                     trident_router_requests_waiting_kv 0
//
// Workers in role `both` are left out, as the policy leaves them.
// `max by (worker)` reads one value per worker whatever the number of
// routers reporting it. A per-worker series is required for at least one
// serving worker of its role (none needed when the role has no serving
// worker): without it the router is not scraped, or knows none of the
// workers, and the policy must not read that as an idle role.
//
// Errors: the source's own (kUnavailable when Prometheus is down or silent,
// kInvalidArgument for a PromQL error, ...), as it returns them; kNotFound
// as above; kInvalidArgument when a query meant to give one value gives
// several series.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/controller/policy/role_policy.h"
#include "services/controller/prometheus/metrics_source.h"

namespace trident::controller {

// The PromQL behind each signal; each may be replaced (e.g. by a flag).
struct SignalQueries {
  // Per worker, label `worker`.
  std::string queued_prefill_tokens_by_worker;
  std::string kv_usage_ratio_by_worker;
  // One value each.
  std::string prefill_tokens_per_second_per_worker;
  std::string ttft_p90_seconds;
  std::string tpot_p90_seconds;
  std::string requests_per_second;
  std::string ttft_rejections_per_second;
  std::string decode_rejections_per_second;
  std::string decode_waiting_sequences;
};

// The queries of the table above, with rates over `rate_window` (at least
// four scrape intervals, so that a rate always has samples).
SignalQueries DefaultSignalQueries(absl::Duration rate_window = absl::Minutes(1));

// Evaluates every query of `queries` now at `source` and assembles the
// signals for the serving workers of `workers`. Stops at the first error.
absl::StatusOr<ClusterSignals> ReadClusterSignals(MetricsSource& source,
                                                  const std::vector<WorkerState>& workers,
                                                  const SignalQueries& queries);

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_POLICY_SIGNAL_READER_H_
