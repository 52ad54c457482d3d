// The Grafana dashboards of deploy/grafana against a live cluster: `trident
// up`'s cluster (controller, attention service with a KV block store, a
// prefill and a decode worker, two workers in role both, router, and a real
// Prometheus scraping every second) under load. Through the router: short
// generations and ones long enough to move to the attention service, every
// prompt opening with the same preamble, so that prefills find it cached.
// Straight to the two `both` workers' own Generation APIs (the only path on
// which the prefix cache's DRAM tier fetches): new prompts that one of them
// computes and writes through to the block store, and the other then fetches
// from there. Every panel's every query, its variables selecting
// everything, must return data (a finite sample) from that Prometheus, and
// every metric the dashboards name must be one Prometheus has scraped. The
// test polls until each query has data or a generous deadline passes, then
// lists each empty query (dashboard, panel, PromQL, what Prometheus said) and
// each unknown metric. On the same cluster, every service's /metrics passes
// `promtool check metrics` (Debian's prometheus package).

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
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
// tokens of context, set below) and move to the attention service.
constexpr int32_t kLongTokens = 80;
constexpr int32_t kShortTokens = 8;
constexpr int kClients = 3;
// The DRAM tier's requests stay under the offload threshold (their KV stays
// in the workers' pools, whose caches the block store follows).
constexpr int32_t kTierTokens = 4;

// Every story through the router opens with this: 19 tokens of the
// cluster's generated model (BOS included), more than one 16-token KV block,
// so that a prefill finds a block of it cached (prefix-aware routing,
// prefix-cache hits, blocks a decode worker holds and is not sent). A short
// story stays under the offload threshold, so that the decode worker caches
// it.
constexpr char kStoryPreamble[] = "Once upon a time, far away, ";

// Client c's n-th generation through the router: a short one, then a long
// one (offloaded), in turn. Deterministic: its prompt is fixed.
cli::GenerateOptions StoryRequest(int client, int n) {
  return {.prompt = absl::StrCat(kStoryPreamble, "client ", client, " told story ", n, "."),
          .max_tokens = n % 2 == 1 ? kLongTokens : kShortTokens,
          .ignore_eos = true,
          .timeout = absl::Seconds(120)};
}

// The n-th generation of the DRAM tier's load, straight to a `both`
// worker's own Generation API. Each story is new (its number is in its
// first KV block), two blocks long, and goes first to `writer`, which
// computes it and writes its cached blocks through to the block store in
// the background, then, one request later (the write-through's time), to
// `reader`, which has never seen it and fetches those blocks from the store
// (the cluster's workers run with --kv_tier_always_fetch, so whatever this
// machine's prefill rate): writer 0, writer 1, reader 0, writer 2, reader 1...
cli::GenerateOptions TierRequest(const std::string& writer, const std::string& reader, int n) {
  const bool to_reader = n >= 2 && n % 2 == 0;
  const int story = to_reader ? n / 2 - 1 : (n + 1) / 2;
  return {.address = to_reader ? reader : writer,
          .prompt = absl::StrCat("Story ", story,
                                 " of the DRAM tier: the cat sat on the mat, and the dog sat "
                                 "on the rug."),
          .max_tokens = kTierTokens,
          .ignore_eos = true,
          .timeout = absl::Seconds(120)};
}

bool Offloaded(const testing::GenerationOutcome& o) { return o.ok && !o.attention_service.empty(); }
bool ServedFromDram(const testing::GenerationOutcome& o) {
  return o.ok && o.dram_cached_tokens > 0;
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

// The output and exit status of `command` run by /bin/sh, its stderr
// merged into its stdout.
struct CommandResult {
  int exit_code = -1;  // -1: it did not exit normally.
  std::string output;
};
CommandResult RunCommand(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {.output = "popen failed"};
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

// `promtool check metrics` over `exposition` (Prometheus's text format),
// written to a file under TEST_TMPDIR named after `name`.
CommandResult PromtoolCheckMetrics(const std::string& name, const std::string& exposition) {
  const std::string path = TestTmpPath(absl::StrCat(name, ".metrics.txt"));
  std::ofstream(path) << exposition;
  return RunCommand(absl::StrCat("promtool check metrics < '", path, "'"));
}

// The cluster every test of the suite reads, its loads running from the
// suite's start to its end.
struct LoadedCluster {
  std::string state_dir;
  cli::ClusterState state;
  std::unique_ptr<controller::PrometheusClient> prometheus;
  absl::Time load_start;
  std::unique_ptr<testing::RouterLoad> load;
  std::unique_ptr<testing::RouterLoad> tier_load;
};

class DashboardLiveTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto cluster = std::make_unique<LoadedCluster>();
    cluster->state_dir = TestTmpPath("cluster");
    cli::ClusterOptions options;
    options.state_dir = cluster->state_dir;
    // Disaggregated serving as `trident up` starts it, plus two `both`
    // workers for the DRAM tier's load (the controller flips neither).
    options.worker_roles = {"prefill", "decode", "both", "both"};
    // Long generations move to the attention service (the default moves
    // only for lack of KV blocks).
    options.offload_min_context_tokens = 64;
    options.worker_flags = {"--pin_threads=false", "--cpu_threads=1", "--kv_tier_always_fetch"};
    options.scrape_interval = absl::Seconds(1);
    // Decisions every 2 s: the controller's forecast needs 3 of them.
    options.controller_flags = {"--decision_interval=2s"};
    absl::StatusOr<cli::ClusterState> state = cli::Up(options);
    ASSERT_THAT(state, IsOk());
    cluster->state = *std::move(state);
    absl::StatusOr<std::unique_ptr<controller::PrometheusClient>> prometheus =
        controller::PrometheusClient::Create(
            {.base_url = cluster->state.PrometheusUrl(), .timeout = absl::Seconds(20)});
    cluster_ = cluster.release();
    ASSERT_THAT(prometheus, IsOk());
    cluster_->prometheus = *std::move(prometheus);

    const cli::ProcessRecord* writer = cluster_->state.Find("worker-2");
    const cli::ProcessRecord* reader = cluster_->state.Find("worker-3");
    ASSERT_NE(writer, nullptr);
    ASSERT_NE(reader, nullptr);
    cluster_->load_start = absl::Now();
    cluster_->load = std::make_unique<testing::RouterLoad>(cluster_->state.RouterAddress(),
                                                           kClients, StoryRequest);
    cluster_->tier_load = std::make_unique<testing::RouterLoad>(
        cluster_->state.RouterAddress(), /*clients=*/1,
        [writer = writer->GrpcAddress(cluster_->state.host),
         reader = reader->GrpcAddress(cluster_->state.host)](int, int n) {
          return TierRequest(writer, reader, n);
        });
  }

  // Stops the loads (their requests in flight answered), then the cluster.
  static void TearDownTestSuite() {
    if (cluster_ == nullptr) return;
    for (std::unique_ptr<testing::RouterLoad>* load : {&cluster_->load, &cluster_->tier_load}) {
      if (*load == nullptr) continue;
      for (const testing::GenerationOutcome& o : (*load)->Stop()) {
        EXPECT_TRUE(o.ok) << o.error;
      }
    }
    EXPECT_THAT(cli::Down(cluster_->state_dir), IsOk());
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(cluster_, nullptr) << "the cluster did not start";
    ASSERT_NE(cluster_->tier_load, nullptr) << "the loads did not start";
  }

  static LoadedCluster* cluster_;
};

LoadedCluster* DashboardLiveTest::cluster_ = nullptr;

TEST_F(DashboardLiveTest, EveryPanelHasDataFromALoadedCluster) {
  absl::StatusOr<std::vector<Dashboard>> dashboards =
      testing::LoadDashboards(RunfilePath("deploy/grafana"));
  ASSERT_THAT(dashboards, IsOk());
  ASSERT_EQ(dashboards->size(), 4u);

  const absl::Time load_start = cluster_->load_start;
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
      if (Answer(*cluster_->prometheus, query, load_start, now)) {
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
  const testing::RouterLoad& load = *cluster_->load;
  const testing::RouterLoad& tier_load = *cluster_->tier_load;
  const int64_t ok = load.Count([](const testing::GenerationOutcome& o) { return o.ok; });
  const int64_t cached =
      load.Count([](const testing::GenerationOutcome& o) { return o.ok && o.cached_tokens > 0; });
  const int64_t offloaded = load.Count(Offloaded);
  const int64_t from_dram = tier_load.Count(ServedFromDram);
  const absl::Duration took = absl::Now() - load_start;

  std::cout << answered.size() << " queries had data, " << pending.size() << " did not, after "
            << absl::FormatDuration(took) << "; load: " << ok << " generations through the router ("
            << cached << " with a cached prefix, " << offloaded << " offloaded), "
            << load.answered() - ok << " failed; DRAM tier: " << tier_load.answered()
            << " generations, " << from_dram << " served from the block store" << std::endl;
  for (const PanelQuery& query : pending) {
    ADD_FAILURE() << "no data: " << query.where << "\n  " << query.promql << "\n  ("
                  << query.last_answer << ")";
  }
  const std::set<std::string> known = KnownMetricNames(cluster_->state.PrometheusUrl());
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
  EXPECT_GT(cached, 0) << "no generation through the router reused its prompt's preamble";
  EXPECT_GT(offloaded, 0) << "no generation moved to the attention service";
  EXPECT_GT(from_dram, 0) << "no generation fetched its prompt from the block store; "
                          << tier_load.last_error();
}

// Every service's /metrics, once the load has been through every path
// (offloaded sequences, the DRAM tier's fetches), parses as Prometheus's
// text format and follows its naming rules (counters end in _total, no
// other type does, base units, ...), as `promtool check metrics` judges.
TEST_F(DashboardLiveTest, EveryServicesMetricsPassPromtool) {
  ASSERT_TRUE(cluster_->load->AwaitCount(Offloaded, 1, kPollDeadline))
      << "no generation moved to the attention service: " << cluster_->load->last_error();
  ASSERT_TRUE(cluster_->tier_load->AwaitCount(ServedFromDram, 1, kPollDeadline))
      << "no generation fetched its prompt from the block store: "
      << cluster_->tier_load->last_error();
  std::vector<std::string> checked;
  for (const cli::ProcessRecord& process : cluster_->state.processes) {
    if (process.component == "prometheus") continue;
    absl::StatusOr<http::HttpResponse> metrics = http::Get(
        absl::StrCat("http://", cluster_->state.host, ":", process.metrics_port, "/metrics"));
    ASSERT_THAT(metrics, IsOk()) << process.name;
    ASSERT_EQ(metrics->status_code, 200) << process.name;
    EXPECT_THAT(metrics->body, ::testing::HasSubstr("# TYPE trident_")) << process.name;
    const CommandResult promtool = PromtoolCheckMetrics(process.name, metrics->body);
    EXPECT_EQ(promtool.exit_code, 0)
        << process.name << "'s /metrics: promtool check metrics says:\n"
        << promtool.output;
    checked.push_back(process.name);
  }
  EXPECT_THAT(checked,
              ::testing::UnorderedElementsAre("controller", "attention-0", "worker-0", "worker-1",
                                              "worker-2", "worker-3", "router"));
}

// The check above can fail: promtool refuses a counter without `_total` and
// a gauge with it.
TEST(PromtoolTest, FlagsMetricsThatBreakPrometheusNaming) {
  const CommandResult good =
      PromtoolCheckMetrics("good",
                           "# HELP trident_test_sent_bytes_total Bytes sent.\n"
                           "# TYPE trident_test_sent_bytes_total counter\n"
                           "trident_test_sent_bytes_total 1\n");
  EXPECT_EQ(good.exit_code, 0) << good.output;
  const CommandResult bad =
      PromtoolCheckMetrics("bad",
                           "# HELP trident_test_sent_bytes Bytes sent.\n"
                           "# TYPE trident_test_sent_bytes counter\n"
                           "trident_test_sent_bytes 1\n"
                           "# HELP trident_test_queued_total Requests queued now.\n"
                           "# TYPE trident_test_queued_total gauge\n"
                           "trident_test_queued_total 1\n");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_THAT(bad.output, ::testing::HasSubstr("trident_test_sent_bytes"));
  EXPECT_THAT(bad.output, ::testing::HasSubstr("trident_test_queued_total"));
}

}  // namespace
}  // namespace trident
