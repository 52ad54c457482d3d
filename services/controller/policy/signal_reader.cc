#include "services/controller/policy/signal_reader.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status/status_macros.h"

namespace trident::controller {
namespace {

using trident::v1::Role;

// The one value of `promql`, or `if_missing` when it has no series.
absl::StatusOr<double> ValueOr(MetricsSource& source, const std::string& promql,
                               double if_missing) {
  TRIDENT_ASSIGN_OR_RETURN(QueryResult result, source.Query({.promql = promql}));
  if (result.type != ResultType::kString && result.series.empty()) return if_missing;
  return SingleValue(result, absl::StrCat("query `", promql, "`"));
}

// Values of `promql` by their `worker` label.
absl::StatusOr<std::map<std::string, double>> ByWorker(MetricsSource& source,
                                                       const std::string& promql) {
  TRIDENT_ASSIGN_OR_RETURN(QueryResult result, source.Query({.promql = promql}));
  std::map<std::string, double> values;
  for (const Series& series : result.series) {
    const auto worker = series.labels.find("worker");
    if (worker == series.labels.end() || series.samples.empty()) continue;
    values[worker->second] = series.samples.back().value;
  }
  return values;
}

// The values of `by_worker` for the serving workers in `role`: their sum,
// or their mean. kNotFound if the role has serving workers and none of them
// has a value; 0 (sum) or NaN (mean) if it has none.
absl::StatusOr<double> ForRole(const std::map<std::string, double>& by_worker,
                               const std::vector<WorkerState>& workers, Role role, bool mean,
                               const std::string& promql) {
  std::vector<std::string> missing;
  double sum = 0;
  int32_t found = 0;
  for (const WorkerState& w : workers) {
    if (!w.serving || w.role != role) continue;
    const auto value = by_worker.find(w.worker_id);
    if (value == by_worker.end()) {
      missing.push_back(w.worker_id);
      continue;
    }
    sum += value->second;
    ++found;
  }
  if (found == 0 && !missing.empty()) {
    return absl::NotFoundError(absl::StrCat("query `", promql, "`: no series for ", RoleName(role),
                                            " worker(s) ", absl::StrJoin(missing, ", "),
                                            " (is the router scraped, and does it know them?)"));
  }
  if (!mean) return sum;
  return found == 0 ? kNoSignal : sum / found;
}

double Ratio(double part, double whole) { return whole > 0 ? part / whole : 0; }

}  // namespace

SignalQueries DefaultSignalQueries(absl::Duration rate_window) {
  const std::string w = absl::StrCat(absl::ToInt64Seconds(rate_window), "s");
  auto p90 = [&w](absl::string_view histogram) {
    return absl::StrCat("histogram_quantile(0.9, sum by (le) (rate(", histogram, "_bucket[", w,
                        "])))");
  };
  auto rejections = [&w](absl::string_view reasons) {
    return absl::StrCat("sum(rate(trident_router_requests_rejected_total{reason=~\"", reasons,
                        "\"}[", w, "]))");
  };
  return SignalQueries{
      .queued_prefill_tokens_by_worker =
          "max by (worker) (trident_router_worker_queued_prefill_tokens)",
      .kv_usage_ratio_by_worker = "max by (worker) (trident_router_worker_kv_usage_ratio)",
      .prefill_tokens_per_second_per_worker = absl::StrCat(
          "max(max_over_time(rate(trident_worker_prompt_tokens_total[", w, "])[15m:]))"),
      .ttft_p90_seconds = p90("trident_router_ttft_seconds"),
      .tpot_p90_seconds = p90("trident_router_tpot_seconds"),
      .requests_per_second = absl::StrCat("sum(rate(trident_router_requests_total[", w, "]))"),
      .ttft_rejections_per_second = rejections("ttft"),
      .decode_rejections_per_second = rejections("tpot|kv_capacity"),
      .decode_waiting_sequences = "sum(trident_router_requests_waiting_kv)",
  };
}

absl::StatusOr<ClusterSignals> ReadClusterSignals(MetricsSource& source,
                                                  const std::vector<WorkerState>& workers,
                                                  const SignalQueries& q) {
  ClusterSignals signals;
  TRIDENT_ASSIGN_OR_RETURN(const auto queued, ByWorker(source, q.queued_prefill_tokens_by_worker));
  TRIDENT_ASSIGN_OR_RETURN(signals.prefill.queued_prefill_tokens,
                           ForRole(queued, workers, trident::v1::ROLE_PREFILL, /*mean=*/false,
                                   q.queued_prefill_tokens_by_worker));
  TRIDENT_ASSIGN_OR_RETURN(const auto kv_usage, ByWorker(source, q.kv_usage_ratio_by_worker));
  TRIDENT_ASSIGN_OR_RETURN(signals.decode.kv_usage_ratio,
                           ForRole(kv_usage, workers, trident::v1::ROLE_DECODE, /*mean=*/true,
                                   q.kv_usage_ratio_by_worker));
  TRIDENT_ASSIGN_OR_RETURN(signals.prefill.prefill_tokens_per_second_per_worker,
                           ValueOr(source, q.prefill_tokens_per_second_per_worker, kNoSignal));
  TRIDENT_ASSIGN_OR_RETURN(signals.prefill.ttft_p90_seconds,
                           ValueOr(source, q.ttft_p90_seconds, kNoSignal));
  TRIDENT_ASSIGN_OR_RETURN(signals.decode.tpot_p90_seconds,
                           ValueOr(source, q.tpot_p90_seconds, kNoSignal));
  TRIDENT_ASSIGN_OR_RETURN(const double requests, ValueOr(source, q.requests_per_second, 0));
  TRIDENT_ASSIGN_OR_RETURN(const double ttft_rejections,
                           ValueOr(source, q.ttft_rejections_per_second, 0));
  TRIDENT_ASSIGN_OR_RETURN(const double decode_rejections,
                           ValueOr(source, q.decode_rejections_per_second, 0));
  TRIDENT_ASSIGN_OR_RETURN(signals.decode.waiting_sequences,
                           ValueOr(source, q.decode_waiting_sequences, 0));
  signals.prefill.ttft_rejected_ratio = Ratio(ttft_rejections, requests);
  signals.decode.rejected_ratio = Ratio(decode_rejections, requests);
  return signals;
}

}  // namespace trident::controller
