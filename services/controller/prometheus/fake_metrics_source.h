#ifndef TRIDENT_SERVICES_CONTROLLER_PROMETHEUS_FAKE_METRICS_SOURCE_H_
#define TRIDENT_SERVICES_CONTROLLER_PROMETHEUS_FAKE_METRICS_SOURCE_H_

// An in-memory MetricsSource for tests. It evaluates no PromQL: a test
// stores series under a query's exact text, and the fake answers that text
// the way Prometheus answers a query over stored samples:
//
//   Query       each series' latest sample at or before the evaluation time
//               (the clock's Now() when the query names none), if it is at
//               most `lookback` old (Prometheus's 5 minutes); a kVector, empty
//               when nothing qualifies, as for a missing series
//   QueryRange  for each step, each series' sample in effect then (same
//               rule); a kMatrix holding the series that have any
//
// Failures are injected: SetError makes every call fail (Prometheus down),
// SetQueryError one query text (a PromQL error). Every call is recorded.

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/time/clock.h"
#include "services/controller/prometheus/metrics_source.h"

namespace trident::controller {

// Thread-safe.
class FakeMetricsSource final : public MetricsSource {
 public:
  // `clock` (not owned, outlives this) gives the default evaluation time.
  // `name` is what Describe() reports, e.g. "prometheus at http://fake:9090".
  explicit FakeMetricsSource(const Clock* clock, std::string name = "fake metrics source");

  // Appends a sample to the series `labels` of `promql`. REQUIRES: `time` is
  // not before that series' last sample.
  void AddSample(const std::string& promql, const Labels& labels, absl::Time time, double value)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Replaces the series `labels` of `promql` with one sample at the clock's
  // Now().
  void Set(const std::string& promql, double value, const Labels& labels = {})
      ABSL_LOCKS_EXCLUDED(mu_);

  // Removes every series of `promql`: it answers nothing from now on.
  void Remove(const std::string& promql) ABSL_LOCKS_EXCLUDED(mu_);

  // Every call fails with `status` until SetError(absl::OkStatus()).
  void SetError(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);

  // Calls for `promql` fail with `status` until set back to OK.
  void SetQueryError(const std::string& promql, absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);

  // The query texts asked so far, in order, failed calls included.
  std::vector<std::string> queries() const ABSL_LOCKS_EXCLUDED(mu_);

  absl::StatusOr<QueryResult> Query(const InstantQuery& query) override ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<QueryResult> QueryRange(const RangeQuery& query) override ABSL_LOCKS_EXCLUDED(mu_);
  std::string Describe() const override { return name_; }

  // How far back an instant query looks for a series' latest sample.
  static constexpr absl::Duration kLookback = absl::Minutes(5);

 private:
  // Records the call and returns the injected failure for `promql`, if any.
  absl::Status Admit(const std::string& promql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* const clock_;
  const std::string name_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<Series>> stored_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::Status> query_errors_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> queries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_PROMETHEUS_FAKE_METRICS_SOURCE_H_
