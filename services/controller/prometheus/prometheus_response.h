#ifndef TRIDENT_SERVICES_CONTROLLER_PROMETHEUS_PROMETHEUS_RESPONSE_H_
#define TRIDENT_SERVICES_CONTROLLER_PROMETHEUS_PROMETHEUS_RESPONSE_H_

// Parsing of the Prometheus HTTP API's answers to `/api/v1/query` and
// `/api/v1/query_range` (prometheus/docs/querying/api.md), apart from the
// transport so that every shape and error is tested without a server:
//
//   {"status": "success",
//    "data": {"resultType": "vector",
//             "result": [{"metric": {"__name__": "up", "job": "w"},
//                         "value": [1700000000.123, "1"]}]},
//    "warnings": ["..."]}                                     (optional)
//
//   "matrix": each result has "values": [[t, "v"], ...] instead of "value";
//   "scalar": "result" is [t, "v"]; "string": "result" is [t, "text"].
//   Values are strings: decimal numbers, "NaN", "+Inf", "-Inf".
//
//   {"status": "error", "errorType": "bad_data", "error": "parse error: ..."}
//
// Error types map to codes as the HTTP API assigns them HTTP statuses:
//
//   errorType           HTTP   code
//   bad_data            400    kInvalidArgument (malformed PromQL or parameter)
//   execution           422    kInvalidArgument (an expression that cannot run
//                              on this data, e.g. many-to-many matching)
//   timeout, canceled   503    kUnavailable (the server gave up; retry later)
//   unavailable         503    kUnavailable
//   internal            500    kInternal
//   other / none        4xx    kInvalidArgument; 5xx kUnavailable
//
// A body that is not JSON is kUnavailable for 5xx statuses (a proxy or a
// server still starting), kFailedPrecondition for other non-2xx statuses
// (the address answers, but not with the Prometheus API, e.g. 404), and
// kInternal for 2xx; so is a JSON body of the wrong shape.

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/controller/prometheus/metrics_source.h"

namespace trident::controller {

// Parses one answer. `http_status` is the response's status code; `origin`
// prefixes every error message (e.g. "prometheus at http://h:9090: query
// `up`"), so that the caller's logs say which server and which query.
absl::StatusOr<QueryResult> ParseQueryResponse(int http_status, absl::string_view body,
                                               absl::string_view origin);

// Parses a sample value as the API writes it: a decimal number, "NaN",
// "+Inf" or "-Inf". kInvalidArgument for anything else.
absl::StatusOr<double> ParseSampleValue(absl::string_view text);

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_PROMETHEUS_PROMETHEUS_RESPONSE_H_
