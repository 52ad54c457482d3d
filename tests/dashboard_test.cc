// The Grafana dashboards of deploy/grafana, statically: each follows the
// project's rules (tests/testing/grafana_dashboard.h: a Prometheus
// datasource variable, timeseries and stat panels with unique ids on it,
// every target a PromQL query over trident_* metrics using only defined
// variables), each covers what the issue asks of it, and every query
// expands with every variable selecting all. dashboard_live_test runs the
// same queries against a loaded cluster.

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/grafana_dashboard.h"

namespace trident {
namespace {

using ::testing::IsEmpty;
using ::trident::testing::Dashboard;
using ::trident::testing::DashboardPanel;
using ::trident::testing::DashboardTarget;
using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;

std::vector<Dashboard> LoadAll() {
  absl::StatusOr<std::vector<Dashboard>> dashboards =
      testing::LoadDashboards(RunfilePath("deploy/grafana"));
  EXPECT_THAT(dashboards, IsOk());
  return dashboards.ok() ? *dashboards : std::vector<Dashboard>{};
}

const Dashboard* Find(const std::vector<Dashboard>& dashboards, const std::string& source) {
  for (const Dashboard& d : dashboards) {
    if (d.source == source) return &d;
  }
  return nullptr;
}

// Every metric name the dashboard's queries read.
std::set<std::string> MetricsOf(const Dashboard& d) {
  std::set<std::string> names;
  for (const DashboardPanel& panel : d.panels) {
    for (const DashboardTarget& target : panel.targets) {
      const std::set<std::string> in = testing::MetricNamesIn(target.expr);
      names.insert(in.begin(), in.end());
    }
  }
  return names;
}

TEST(DashboardTest, TheFourDashboardsFollowTheRules) {
  const std::vector<Dashboard> dashboards = LoadAll();
  std::vector<std::string> sources;
  std::set<std::string> uids;
  for (const Dashboard& d : dashboards) {
    sources.push_back(d.source);
    EXPECT_TRUE(uids.insert(d.uid).second) << d.source << ": uid " << d.uid << " repeated";
    EXPECT_THAT(testing::LintDashboard(d), IsEmpty());
  }
  EXPECT_EQ(sources, (std::vector<std::string>{"attention.json", "controller.json", "overview.json",
                                               "workers.json"}));
}

TEST(DashboardTest, PerClassAndPerWorkerVariablesComeFromLabelValues) {
  const std::vector<Dashboard> dashboards = LoadAll();
  for (const auto& [source, variable] :
       std::vector<std::pair<std::string, std::string>>{{"overview.json", "class"},
                                                        {"workers.json", "worker"},
                                                        {"attention.json", "worker"},
                                                        {"attention.json", "service"}}) {
    const Dashboard* d = Find(dashboards, source);
    ASSERT_NE(d, nullptr) << source;
    const testing::DashboardVariable* v = d->FindVariable(variable);
    ASSERT_NE(v, nullptr) << source << " has no $" << variable;
    EXPECT_EQ(v->type, "query");
    EXPECT_TRUE(v->include_all) << source << " $" << variable;
    EXPECT_THAT(testing::LabelValuesQuery(v->query), IsOk()) << source << " $" << variable;
  }
}

TEST(DashboardTest, EachDashboardChartsWhatTheIssueAsksOfIt) {
  const std::vector<Dashboard> dashboards = LoadAll();
  const std::map<std::string, std::vector<std::string>> wanted = {
      {"overview.json",
       {"trident_router_requests_total", "trident_router_requests_rejected_total",
        "trident_router_ttft_seconds_bucket", "trident_router_tpot_seconds_bucket",
        "trident_router_itl_seconds_bucket", "trident_router_e2e_seconds_bucket",
        "trident_router_routing_decisions_total",
        "trident_router_prefix_cache_predicted_tokens_total",
        "trident_router_prefix_cache_delivered_tokens_total"}},
      {"workers.json",
       {"trident_worker_role", "trident_worker_num_requests_running",
        "trident_worker_num_requests_waiting", "trident_worker_iteration_tokens_bucket",
        "trident_worker_iteration_decode_sequences_bucket", "trident_worker_kv_cache_usage_ratio",
        "trident_router_worker_queued_prefill_tokens", "trident_worker_kv_transfer_seconds_bucket",
        "trident_worker_kv_transfer_bytes_total", "trident_worker_kv_lane_info",
        // The prefix cache and its DRAM tier.
        "trident_worker_prefix_cache_hits_total", "trident_worker_prefix_cache_queries_total",
        "trident_worker_kv_cache_cached_blocks", "trident_worker_kv_transfer_cached_blocks_total",
        "trident_worker_kv_tier_fetched_bytes_total", "trident_worker_kv_tier_fetch_seconds_total",
        "trident_worker_kv_tier_fetches_total", "trident_worker_kv_tier_lookups_total",
        "trident_worker_kv_tier_written_blocks_total", "trident_worker_kv_tier_failures_total"}},
      {"attention.json",
       {"trident_attention_sequences", "trident_attention_held_bytes",
        "trident_attention_kernel_seconds_bucket", "trident_attention_bytes_read_total",
        "trident_worker_cpu_attention_seconds_total",
        // The block store (the prefix cache's DRAM tier).
        "trident_attention_store_blocks", "trident_attention_store_bytes",
        "trident_attention_store_capacity_bytes", "trident_attention_store_blocks_written_total",
        "trident_attention_store_evictions_total", "trident_attention_store_lookups_total",
        "trident_attention_store_hit_blocks_total", "trident_attention_store_blocks_read_total"}},
      {"controller.json",
       {"trident_controller_pressure", "trident_controller_role_flips_total",
        "trident_controller_decision_total", "trident_controller_members",
        "trident_controller_flip_pending", "trident_controller_flip_failures_total"}},
  };
  for (const auto& [source, metrics] : wanted) {
    const Dashboard* d = Find(dashboards, source);
    ASSERT_NE(d, nullptr) << source;
    const std::set<std::string> charted = MetricsOf(*d);
    for (const std::string& metric : metrics) {
      EXPECT_TRUE(charted.count(metric) > 0) << source << " does not chart " << metric;
    }
  }
}

// A hit rate is hits over lookups of the same thing: every workers.json
// query over prefix-cache hits divides them by the prompt tokens looked up,
// keeping the tier apart (the tier label exists on hits only).
TEST(DashboardTest, PrefixCacheHitRatesDivideHitsByQueriesPerTier) {
  const std::vector<Dashboard> dashboards = LoadAll();
  const Dashboard* workers = Find(dashboards, "workers.json");
  ASSERT_NE(workers, nullptr);
  int rates = 0;
  for (const DashboardPanel& panel : workers->panels) {
    for (const DashboardTarget& target : panel.targets) {
      const std::set<std::string> metrics = testing::MetricNamesIn(target.expr);
      if (metrics.count("trident_worker_prefix_cache_hits_total") == 0) continue;
      ++rates;
      EXPECT_TRUE(metrics.count("trident_worker_prefix_cache_queries_total") > 0)
          << panel.title << ": " << target.expr;
      EXPECT_THAT(target.expr, ::testing::HasSubstr("tier)")) << panel.title;
      EXPECT_THAT(target.expr, ::testing::HasSubstr("/ ignoring (tier) group_left")) << panel.title;
    }
  }
  EXPECT_GE(rates, 2) << "a hit rate over time and one over the dashboard's range";
}

TEST(DashboardTest, EveryQueryExpandsWithEveryVariableSelectingAll) {
  const std::map<std::string, std::string> builtins = {
      {"__rate_interval", "15s"}, {"__interval", "2s"}, {"__range", "1h"}};
  int queries = 0;
  for (const Dashboard& d : LoadAll()) {
    const std::map<std::string, std::string> values = testing::SelectAllValues(d, builtins);
    for (const DashboardPanel& panel : d.panels) {
      for (const DashboardTarget& target : panel.targets) {
        absl::StatusOr<std::string> expanded = testing::ExpandVariables(target.expr, values);
        ASSERT_THAT(expanded, IsOk()) << d.source << " \"" << panel.title << "\"";
        EXPECT_EQ(expanded->find('$'), std::string::npos) << *expanded;
        ++queries;
      }
    }
  }
  EXPECT_GT(queries, 40);
}

}  // namespace
}  // namespace trident
