#ifndef TRIDENT_SERVICES_CONTROLLER_PROMETHEUS_PROMETHEUS_CLIENT_H_
#define TRIDENT_SERVICES_CONTROLLER_PROMETHEUS_PROMETHEUS_CLIENT_H_

// A MetricsSource backed by a Prometheus server's HTTP API:
// `GET <base_url>/api/v1/query?query=...&time=...&timeout=...` and
// `GET <base_url>/api/v1/query_range?query=...&start=...&end=...&step=...`,
// over libcurl (common/http), answers parsed by ParseQueryResponse.
//
// Every request is bounded by `timeout`, sent to the server too (its
// `timeout` parameter) so that it stops evaluating a query nobody waits for.
// The states a caller sees (see MetricsSource for the whole list):
//
//   Prometheus down (connection refused, no route)   kUnavailable, "prometheus at
//                                                     <url>: ... unreachable: <why>"
//   Prometheus silent past `timeout`                  kUnavailable, "prometheus at
//                                                     <url>: ... no answer within <t>"
//   PromQL error                                      kInvalidArgument with the
//                                                     API's errorType and error
//   series missing                                    OK with no series; use
//                                                     SingleValue for kNotFound

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/controller/prometheus/metrics_source.h"

namespace trident::controller {

struct PrometheusClientOptions {
  // Where the API is: scheme, host, port and an optional path prefix (a
  // server run with --web.route-prefix), e.g. "http://127.0.0.1:9090". A
  // trailing slash is ignored.
  std::string base_url;
  // Longest wait for one answer, connection included. > 0.
  absl::Duration timeout = absl::Seconds(5);
};

// Thread-safe: it holds no state beyond its options, and every call uses a
// connection of its own.
class PrometheusClient final : public MetricsSource {
 public:
  // kInvalidArgument when `base_url` is not an http:// or https:// URL, or
  // `timeout` is not positive. Connects to nothing.
  static absl::StatusOr<std::unique_ptr<PrometheusClient>> Create(PrometheusClientOptions options);

  absl::StatusOr<QueryResult> Query(const InstantQuery& query) override;
  absl::StatusOr<QueryResult> QueryRange(const RangeQuery& query) override;

  // "prometheus at <base_url>".
  std::string Describe() const override;

 private:
  explicit PrometheusClient(PrometheusClientOptions options) : options_(std::move(options)) {}

  // GETs `<base_url><path_and_query>`; `what` names the request in errors.
  absl::StatusOr<QueryResult> Get(const std::string& path_and_query, const std::string& what);

  const PrometheusClientOptions options_;
};

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_PROMETHEUS_PROMETHEUS_CLIENT_H_
