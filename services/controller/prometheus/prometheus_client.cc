#include "services/controller/prometheus/prometheus_client.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/http/http_client.h"
#include "services/controller/prometheus/prometheus_response.h"

namespace trident::controller {
namespace {

// The API takes times as Unix seconds and durations as seconds, both with
// fractions; milliseconds are its resolution.
std::string ApiTime(absl::Time time) {
  return absl::StrFormat("%.3f", static_cast<double>(absl::ToUnixMillis(time)) / 1000);
}

std::string ApiSeconds(absl::Duration duration) {
  return absl::StrFormat("%.3f", absl::ToDoubleSeconds(duration));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PrometheusClient>> PrometheusClient::Create(
    PrometheusClientOptions options) {
  while (absl::EndsWith(options.base_url, "/")) options.base_url.pop_back();
  const absl::string_view url = options.base_url;
  absl::string_view host = url;
  const bool has_scheme =
      absl::ConsumePrefix(&host, "http://") || absl::ConsumePrefix(&host, "https://");
  if (!has_scheme || host.empty() || host[0] == '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "Prometheus URL must be http://host:port or https://host:port, got \"", url, "\""));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Prometheus query timeout must be positive, got ", absl::FormatDuration(options.timeout)));
  }
  return std::unique_ptr<PrometheusClient>(new PrometheusClient(std::move(options)));
}

std::string PrometheusClient::Describe() const {
  return absl::StrCat("prometheus at ", options_.base_url);
}

absl::StatusOr<QueryResult> PrometheusClient::Query(const InstantQuery& query) {
  if (query.promql.empty()) return absl::InvalidArgumentError("empty PromQL query");
  std::string path = absl::StrCat("/api/v1/query?query=", http::UrlEncode(query.promql),
                                  "&timeout=", ApiSeconds(options_.timeout));
  if (query.time.has_value()) absl::StrAppend(&path, "&time=", ApiTime(*query.time));
  return Get(path, absl::StrCat("query `", query.promql, "`"));
}

absl::StatusOr<QueryResult> PrometheusClient::QueryRange(const RangeQuery& query) {
  if (query.promql.empty()) return absl::InvalidArgumentError("empty PromQL query");
  if (query.end < query.start) {
    return absl::InvalidArgumentError(absl::StrCat("range query `", query.promql, "`: end ",
                                                   absl::FormatTime(query.end), " is before start ",
                                                   absl::FormatTime(query.start)));
  }
  if (query.step <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("range query `", query.promql,
                                                   "`: step must be positive, got ",
                                                   absl::FormatDuration(query.step)));
  }
  const std::string path =
      absl::StrCat("/api/v1/query_range?query=", http::UrlEncode(query.promql),
                   "&start=", ApiTime(query.start), "&end=", ApiTime(query.end),
                   "&step=", ApiSeconds(query.step), "&timeout=", ApiSeconds(options_.timeout));
  absl::StatusOr<QueryResult> result = Get(path, absl::StrCat("range query `", query.promql, "`"));
  if (result.ok() && result->type != ResultType::kMatrix) {
    return absl::InternalError(absl::StrCat(Describe(), ": range query `", query.promql,
                                            "` answered a ", ResultTypeName(result->type),
                                            ", not a matrix"));
  }
  return result;
}

absl::StatusOr<QueryResult> PrometheusClient::Get(const std::string& path_and_query,
                                                  const std::string& what) {
  const std::string origin = absl::StrCat(Describe(), ": ", what);
  absl::StatusOr<http::HttpResponse> response =
      http::Get(absl::StrCat(options_.base_url, path_and_query), options_.timeout);
  if (!response.ok()) {
    // Down and silent are one state to the controller: it cannot read the
    // metrics now, and a later call may.
    if (response.status().code() == absl::StatusCode::kDeadlineExceeded) {
      return absl::UnavailableError(
          absl::StrCat(origin, ": no answer within ", absl::FormatDuration(options_.timeout)));
    }
    // common/http names the whole URL; `origin` already says where.
    absl::string_view why = response.status().message();
    if (const size_t colon = why.find(": "); absl::StartsWith(why, "GET ") && colon != why.npos) {
      why.remove_prefix(colon + 2);
    }
    return absl::UnavailableError(absl::StrCat(origin, ": unreachable: ", why));
  }
  return ParseQueryResponse(response->status_code, response->body, origin);
}

}  // namespace trident::controller
