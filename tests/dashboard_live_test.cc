// The Grafana dashboards of deploy/grafana against a live cluster: `trident
// up`'s cluster (controller, attention service, a prefill and a decode
// worker, router, and a real Prometheus scraping every second) under load
// through the router, short generations and ones long enough to move to the
// attention service. Every panel's every query, its variables selecting
// everything, must return data (a finite sample) from that Prometheus, and
// every metric the dashboards name must be one Prometheus has scraped. The
// test polls until each query has data or a generous deadline passes, then
// lists each empty query (dashboard, panel, PromQL, what Prometheus said) and
// each unknown metric.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/http/http_client.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/controller/prometheus/metrics_source.h"
#include "services/controller/prometheus/prometheus_client.h"
#include "tests/testing/grafana_dashboard.h"
#include "tests/testing/router_load.h"
#include "tools/cli/cluster.h"
#include "tools/cli/generate.h"

namespace trident {
namespace {

using ::trident::controller::InstantQuery;
using ::trident::controller::MetricsSource;
using ::trident::controller::QueryResult;
using ::trident::controller::RangeQuery;
using ::trident::testing::Dashboard;
using ::trident::testing::DashboardPanel;
using ::trident::testing::DashboardTarget;
using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::TestTmpPath;
using json = nlohmann::json;

// Grafana's $__rate_interval is max($__interval + scrape interval, 4 x the
// scrape interval); with the cluster's 1 s scrapes, 15 s windows hold enough
// samples for every rate() and stay short enough to follow the load.
constexpr char kRateInterval[] = "15s";
constexpr absl::Duration kStep = absl::Seconds(1);
// Every query had data 12 s into the load on an idle 2-core machine; ten
// times that leaves room for a busy one. The test ends as soon as every
// query has data.
constexpr absl::Duration kPollDeadline = absl::Seconds(150);
// Generations of this many tokens pass the cluster's offload threshold (64
// tokens of context) and move to the attention service.
constexpr int32_t kLongTokens = 80;
constexpr int32_t kShortTokens = 8;
constexpr int kClients = 3;

// Client c's n-th generation: a short one, then a long one (offloaded), in
// turn. Deterministic: its prompt is fixed.
cli::GenerateOptions StoryRequest(int client, int n) {
  return {.prompt = absl::StrCat("Client ", client, " tells story ", n, ": once upon a time"),
          .max_tokens = n % 2 == 1 ? kLongTokens : kShortTokens,
          .ignore_eos = true,
          .timeout = absl::Seconds(120)};
}

// One query of one panel (or a variable's values).
struct PanelQuery {
  std::string where;  // "overview.json / Request rate / A"
  // As in the dashboard, and the values of its dashboard's variables
  // (selecting everything), $__range left to each try.
  std::string expr;
  std::map<std::string, std::string> values;
  bool instant = false;
  std::set<std::string> metrics;
  // The PromQL last sent.
  std::string promql;
  // Why the last try found no data.
  std::string last_answer = "not queried";
};

bool HasFiniteSample(const QueryResult& result) {
  for (const controller::Series& series : result.series) {
    for (const controller::Sample& sample : series.samples) {
      if (std::isfinite(sample.value)) return true;
    }
  }
  return false;
}

// Every panel query of `dashboards`, plus each query variable's values as a
// query (a variable with no values leaves its dashboard empty).
std::vector<PanelQuery> QueriesOf(const std::vector<Dashboard>& dashboards) {
  std::vector<PanelQuery> queries;
  for (const Dashboard& d : dashboards) {
    const std::map<std::string, std::string> values =
        testing::SelectAllValues(d, {{"__rate_interval", kRateInterval}, {"__interval", "1s"}});
    for (const testing::DashboardVariable& v : d.variables) {
      if (v.type != "query") continue;
      absl::StatusOr<std::string> promql = testing::LabelValuesQuery(v.query);
      EXPECT_THAT(promql, IsOk()) << d.source << " $" << v.name;
      if (!promql.ok()) continue;
      queries.push_back({.where = absl::StrCat(d.source, " / variable $", v.name),
                         .expr = *promql,
                         .instant = true,
                         .metrics = testing::MetricNamesIn(v.query)});
    }
    for (const DashboardPanel& panel : d.panels) {
      for (const DashboardTarget& target : panel.targets) {
        queries.push_back(
            {.where = absl::StrCat(d.source, " / ", panel.title, " / ", target.ref_id),
             .expr = target.expr,
             .values = values,
             .instant = target.instant,
             .metrics = testing::MetricNamesIn(target.expr)});
      }
    }
  }
  return queries;
}

// Runs `query` the way Grafana does (an instant query at `now`, or a range
// query since `since`, which is also $__range); true when it has a finite
// sample.
bool Answer(MetricsSource& prometheus, PanelQuery& query, absl::Time since, absl::Time now) {
  std::map<std::string, std::string> values = query.values;
  // At least 10 s, so that increase() over it spans several scrapes.
  values["__range"] = absl::StrCat(std::max<int64_t>(10, absl::ToInt64Seconds(now - since)), "s");
  absl::StatusOr<std::string> promql = testing::ExpandVariables(query.expr, values);
  if (!promql.ok()) {
    query.last_answer = promql.status().ToString();
    return false;
  }
  query.promql = *promql;
  absl::StatusOr<QueryResult> result =
      query.instant ? prometheus.Query(InstantQuery{.promql = query.promql, .time = now})
                    : prometheus.QueryRange(RangeQuery{
                          .promql = query.promql, .start = since, .end = now, .step = kStep});
  if (!result.ok()) {
    query.last_answer = result.status().ToString();
    return false;
  }
  if (HasFiniteSample(*result)) return true;
  query.last_answer = result->series.empty()
                          ? "no series"
                          : absl::StrCat(result->series.size(), " series, no finite sample");
  return false;
}

// Every metric name Prometheus has scraped (/api/v1/label/__name__/values).
std::set<std::string> KnownMetricNames(const std::string& prometheus_url) {
  absl::StatusOr<http::HttpResponse> response =
      http::Get(prometheus_url + "/api/v1/label/__name__/values");
  EXPECT_THAT(response, IsOk());
  if (!response.ok()) return {};
  const json body = json::parse(response->body, nullptr, /*allow_exceptions=*/false);
  std::set<std::string> names;
  if (body.is_object() && body.contains("data") && body["data"].is_array()) {
    for (const json& name : body["data"]) {
      if (name.is_string()) names.insert(name.get<std::string>());
    }
  }
  EXPECT_FALSE(names.empty()) << response->body;
  return names;
}

TEST(DashboardLiveTest, EveryPanelHasDataFromALoadedCluster) {
  absl::StatusOr<std::vector<Dashboard>> dashboards =
      testing::LoadDashboards(RunfilePath("deploy/grafana"));
  ASSERT_THAT(dashboards, IsOk());
  ASSERT_EQ(dashboards->size(), 4u);

  const std::string state_dir = TestTmpPath("cluster");
  cli::ClusterOptions options;
  options.state_dir = state_dir;
  options.worker_flags = {"--pin_threads=false", "--cpu_threads=1"};
  options.scrape_interval = absl::Seconds(1);
  // Decisions every 2 s: the controller's forecast needs 3 of them.
  options.controller_flags = {"--decision_interval=2s"};
  absl::StatusOr<cli::ClusterState> cluster = cli::Up(options);
  ASSERT_THAT(cluster, IsOk());
  absl::Cleanup down = [&state_dir] { EXPECT_THAT(cli::Down(state_dir), IsOk()); };
  absl::StatusOr<std::unique_ptr<controller::PrometheusClient>> prometheus =
      controller::PrometheusClient::Create(
          {.base_url = cluster->PrometheusUrl(), .timeout = absl::Seconds(20)});
  ASSERT_THAT(prometheus, IsOk());

  const absl::Time load_start = absl::Now();
  testing::RouterLoad load(cluster->RouterAddress(), kClients, StoryRequest);
  std::vector<PanelQuery> pending = QueriesOf(*dashboards);
  std::vector<PanelQuery> answered;
  // Prometheus gets data only by scraping, so this polls it: each round asks
  // the queries still without data, with a growing pause between rounds.
  absl::Duration backoff = absl::Milliseconds(500);
  while (true) {
    const absl::Time now = absl::Now();
    std::vector<PanelQuery> queries = std::move(pending);
    pending.clear();
    for (PanelQuery& query : queries) {
      if (Answer(**prometheus, query, load_start, now)) {
        answered.push_back(std::move(query));
      } else {
        pending.push_back(std::move(query));
      }
    }
    if (pending.size() != queries.size()) {
      std::cout << "after " << absl::FormatDuration(absl::Trunc(now - load_start, kStep)) << ": "
                << pending.size() << " queries without data" << std::endl;
    }
    if (pending.empty() || absl::Now() > load_start + kPollDeadline) break;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
  load.Stop();
  const int64_t ok = load.Count([](const testing::GenerationOutcome& o) { return o.ok; });
  const int64_t failed = load.answered() - ok;
  const int64_t offloaded = load.Count([](const testing::GenerationOutcome& o) {
    return o.ok && !o.attention_service.empty();
  });
  const absl::Duration took = absl::Now() - load_start;

  std::cout << answered.size() << " queries had data, " << pending.size() << " did not, after "
            << absl::FormatDuration(took) << "; load: " << ok << " generations (" << offloaded
            << " offloaded), " << failed << " failed" << std::endl;
  for (const PanelQuery& query : pending) {
    ADD_FAILURE() << "no data: " << query.where << "\n  " << query.promql << "\n  ("
                  << query.last_answer << ")";
  }
  const std::set<std::string> known = KnownMetricNames(cluster->PrometheusUrl());
  std::set<std::string> unknown;
  for (const std::vector<PanelQuery>* queries : {&answered, &pending}) {
    for (const PanelQuery& query : *queries) {
      for (const std::string& metric : query.metrics) {
        if (known.count(metric) == 0) unknown.insert(metric);
      }
    }
  }
  EXPECT_TRUE(unknown.empty()) << "metrics the dashboards name that Prometheus never scraped:\n  "
                               << absl::StrJoin(unknown, "\n  ");
  EXPECT_GT(ok, 0) << load.last_error();
  EXPECT_GT(offloaded, 0) << "no generation moved to the attention service";
  EXPECT_EQ(failed, 0) << load.last_error();
}

}  // namespace
}  // namespace trident
