// Reading a service's Prometheus /metrics in integration tests.

#ifndef TRIDENT_TESTS_TESTING_METRICS_SCRAPE_H_
#define TRIDENT_TESTS_TESTING_METRICS_SCRAPE_H_

#include <functional>
#include <initializer_list>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/types/optional.h"
#include "common/http/http_client.h"
#include "tests/testing/service_process.h"

namespace trident::testing {

// The value of the series written exactly as `series` (name and labels in
// the exposition's order, which is by label name) in a /metrics body.
inline absl::optional<double> ValueOf(const std::string& body, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (!absl::ConsumePrefix(&line, series) || !absl::ConsumePrefix(&line, " ")) continue;
    double v;
    if (absl::SimpleAtod(line.substr(0, line.find(' ')), &v)) return v;
  }
  return absl::nullopt;
}

// `s`'s /metrics body; empty when it cannot be read.
inline std::string Scrape(const ServiceProcess& s) {
  absl::StatusOr<http::HttpResponse> r =
      http::Get(absl::StrCat("http://127.0.0.1:", s.metrics_port, "/metrics"));
  if (!r.ok() || r->status_code != 200) return "";
  return r->body;
}

// Scrapes `s` until `done` holds for the body (returned), or 20 s passed
// (the last body). What a process records after the client saw the end of
// its stream lands a moment later.
inline std::string ScrapeUntil(const ServiceProcess& s,
                               const std::function<bool(const std::string&)>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::string body;
  do {
    body = Scrape(s);
    if (done(body)) break;
  } while (absl::Now() < deadline);
  return body;
}

// Scrapes the router `router` until its load gauges name every worker of
// `worker_ids` (each has sent it a load report, so admission can place
// requests there), or 20 s passed; whether they all did.
inline bool RouterKnowsWorkers(const ServiceProcess& router,
                               std::initializer_list<absl::string_view> worker_ids) {
  auto knows = [&](const std::string& body) {
    for (absl::string_view id : worker_ids) {
      if (!ValueOf(body,
                   absl::StrCat("trident_router_worker_kv_usage_ratio{worker=\"", id, "\"}"))) {
        return false;
      }
    }
    return true;
  };
  return knows(ScrapeUntil(router, knows));
}

}  // namespace trident::testing

#endif  // TRIDENT_TESTS_TESTING_METRICS_SCRAPE_H_
