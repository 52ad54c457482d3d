#ifndef TRIDENT_SERVICES_CONTROLLER_PROMETHEUS_METRICS_SOURCE_H_
#define TRIDENT_SERVICES_CONTROLLER_PROMETHEUS_METRICS_SOURCE_H_

// Where the controller reads the cluster's metrics: PromQL evaluated by a
// Prometheus server (PrometheusClient) or, in tests, an in-memory store
// (FakeMetricsSource). The role policy's caller reads through this interface
// and never sees HTTP.
//
// Results keep Prometheus's model (the HTTP API's `resultType`):
//
//   type      series                              example
//   kVector   one sample each, at the query time   `up`, `sum by (worker) (x)`
//   kMatrix   many samples each, by time           `x[1m]`, every range query
//   kScalar   one series without labels            `scalar(x)`, `1 + 1`
//   kString   none (`string_value` holds it)       `"text"`
//
// A query that matches no series is not an error: it succeeds with no
// series, exactly as Prometheus answers it. `SingleValue` turns that into
// kNotFound for callers that need one number. Values may be NaN or +/-Inf
// (Prometheus's "NaN", "+Inf", "-Inf"), e.g. a histogram quantile over no
// observations is NaN.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trident::controller {

// A series' labels, `__name__` included when the result keeps it. Sorted, so
// two equal label sets compare equal and print alike.
using Labels = std::map<std::string, std::string>;

struct Sample {
  absl::Time time;
  double value = 0;
};

struct Series {
  Labels labels;
  // Ordered by time; exactly one for kVector and kScalar.
  std::vector<Sample> samples;
};

enum class ResultType { kVector, kMatrix, kScalar, kString };

// "vector", "matrix", "scalar", "string": the API's names.
absl::string_view ResultTypeName(ResultType type);

struct QueryResult {
  ResultType type = ResultType::kVector;
  std::vector<Series> series;
  // Only for kString.
  std::string string_value;
  // Warnings the server attached to an otherwise successful answer.
  std::vector<std::string> warnings;
};

// An instant query: `promql` evaluated at one time.
struct InstantQuery {
  std::string promql;
  // Evaluation time; unset: the source's current time.
  std::optional<absl::Time> time;
};

// A range query: `promql` evaluated at start, start + step, ... up to end.
struct RangeQuery {
  std::string promql;
  absl::Time start;
  absl::Time end;
  // > 0.
  absl::Duration step;
};

// Thread-safe: every implementation may be called from several threads.
class MetricsSource {
 public:
  virtual ~MetricsSource() = default;

  // Evaluates an instant query. Returns:
  //   kInvalidArgument   the query is empty, or the server rejects it (PromQL
  //                      syntax, or an expression it cannot execute); the
  //                      message carries the server's error type and text.
  //   kUnavailable       the source cannot be reached, or did not answer in
  //                      time; the message names its address.
  //   kInternal          the answer is not a well-formed API response.
  //   kFailedPrecondition the address answers, but is not a Prometheus API.
  // A query matching nothing succeeds with no series.
  virtual absl::StatusOr<QueryResult> Query(const InstantQuery& query) = 0;

  // Evaluates a range query; a kMatrix result. Errors as Query, plus
  // kInvalidArgument for end < start or step <= 0.
  virtual absl::StatusOr<QueryResult> QueryRange(const RangeQuery& query) = 0;

  // Who answers, for messages: e.g. "prometheus at http://127.0.0.1:9090".
  virtual std::string Describe() const = 0;
};

// The value of a result with exactly one series and one sample (the last
// sample of a matrix's only series). kNotFound when the result has no series
// (the message names `what`, e.g. the query); kInvalidArgument when it has
// several, or is a string.
absl::StatusOr<double> SingleValue(const QueryResult& result, absl::string_view what);

// Human-readable, for logs and test output: `{__name__="up", job="x"}`.
std::string LabelsToString(const Labels& labels);

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_PROMETHEUS_METRICS_SOURCE_H_
