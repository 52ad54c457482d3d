#ifndef TRIDENT_COMMON_HTTP_HTTP_CLIENT_H_
#define TRIDENT_COMMON_HTTP_HTTP_CLIENT_H_

// A minimal blocking HTTP/1.1 client over libcurl, for talking to Prometheus
// (`/api/v1/query`, `/api/v1/targets`, `/-/ready`) and scraping `/metrics`.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trident::http {

struct HttpResponse {
  int status_code = 0;
  std::string body;
};

// GETs `url`. Any HTTP status is a successful response; transport failures
// (refused, timed out, malformed URL) return kUnavailable or
// kDeadlineExceeded with curl's explanation. Thread-safe.
absl::StatusOr<HttpResponse> Get(absl::string_view url, absl::Duration timeout = absl::Seconds(10));

// Percent-encodes `text` for use in a query string.
std::string UrlEncode(absl::string_view text);

}  // namespace trident::http

#endif  // TRIDENT_COMMON_HTTP_HTTP_CLIENT_H_
