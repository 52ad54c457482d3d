#include "tests/testing/grafana_dashboard.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// A dashboard that follows every rule: a datasource variable, a class
// variable, a row and two panels (one inside a collapsed row).
constexpr char kGood[] = R"json({
  "uid": "t", "title": "Test", "schemaVersion": 39,
  "templating": {"list": [
    {"name": "datasource", "type": "datasource", "query": "prometheus"},
    {"name": "class", "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
     "query": {"query": "label_values(trident_router_requests_total, class)"},
     "includeAll": true, "allValue": ".+"},
    {"name": "slo", "type": "custom", "query": "0.5,1", "current": {"value": "1"}}
  ]},
  "panels": [
    {"id": 1, "type": "timeseries", "title": "Rate", "datasource": {"uid": "${datasource}"},
     "gridPos": {"x": 0, "y": 0, "w": 12, "h": 8},
     "targets": [{"refId": "A", "expr": "sum(rate(trident_router_requests_total{class=~\"$class\"}[$__rate_interval]))"}]},
    {"id": 2, "type": "row", "title": "More", "collapsed": true,
     "gridPos": {"x": 0, "y": 8, "w": 24, "h": 1},
     "panels": [
       {"id": 3, "type": "stat", "title": "Under SLO", "datasource": {"uid": "${datasource}"},
        "gridPos": {"x": 0, "y": 9, "w": 6, "h": 4},
        "targets": [{"refId": "A", "instant": true, "datasource": {"uid": "${datasource}"},
                     "expr": "sum(trident_router_ttft_seconds_bucket{le=\"${slo}\"})"}]}
     ]}
  ]
})json";

TEST(GrafanaDashboardTest, ParsesVariablesAndPanelsIncludingACollapsedRowsOwn) {
  absl::StatusOr<Dashboard> d = ParseDashboard(kGood, "good.json");
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ(d->uid, "t");
  EXPECT_EQ(d->schema_version, 39);
  ASSERT_EQ(d->variables.size(), 3u);
  EXPECT_EQ(d->variables[1].query, "label_values(trident_router_requests_total, class)");
  EXPECT_EQ(d->variables[1].datasource_uid, "${datasource}");
  EXPECT_EQ(d->variables[1].all_value, ".+");
  EXPECT_EQ(d->variables[2].current, "1");
  ASSERT_EQ(d->panels.size(), 3u);
  EXPECT_EQ(d->panels[1].type, "row");
  EXPECT_EQ(d->panels[2].title, "Under SLO");
  ASSERT_EQ(d->panels[2].targets.size(), 1u);
  EXPECT_TRUE(d->panels[2].targets[0].instant);
  EXPECT_FALSE(d->panels[0].targets[0].instant);
  EXPECT_THAT(LintDashboard(*d), IsEmpty());
}

TEST(GrafanaDashboardTest, RejectsTextThatIsNotADashboard) {
  EXPECT_THAT(ParseDashboard("{", "a.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a.json: not valid JSON")));
  EXPECT_THAT(ParseDashboard("[]", "a.json"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseDashboard(R"({"panels": [{"id": "one"}]})", "a.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"id\" is not an integer")));
  EXPECT_THAT(ParseDashboard(R"({"panels": [{"id": 1, "targets": [{"expr": 5}]}]})", "a.json"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("targets[0]")));
  EXPECT_THAT(
      ParseDashboard(R"({"panels": [{"id": 1, "targets": [{"expr": "up", "instant": "yes"}]}]})",
                     "a.json"),
      StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseDashboard(R"({"templating": {"list": [{"name": "w", "includeAll": 1}]}})",
                             "a.json"),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(GrafanaDashboardTest, LintNamesEveryBrokenRule) {
  constexpr char kBad[] = R"json({
    "uid": "", "title": "Bad", "schemaVersion": 27,
    "templating": {"list": [
      {"name": "worker", "type": "query", "datasource": {"uid": "prom-1"}, "query": "x"}
    ]},
    "panels": [
      {"id": 1, "type": "graph", "title": "Old", "datasource": {"uid": "${datasource}"},
       "gridPos": {"x": 0, "y": 0, "w": 12, "h": 8},
       "targets": [{"refId": "A", "expr": "up"}]},
      {"id": 1, "type": "timeseries", "title": "Twice", "datasource": {"uid": "prom-1"},
       "gridPos": {"x": 20, "y": 0, "w": 8, "h": 8},
       "targets": [{"refId": "A", "expr": "trident_x{a=\"$nope\"}"},
                   {"refId": "A", "expr": "trident_y"}]},
      {"id": 3, "type": "stat", "title": "Empty", "datasource": {"uid": "${datasource}"},
       "gridPos": {"x": 0, "y": 8, "w": 6, "h": 4}}
    ]
  })json";
  absl::StatusOr<Dashboard> d = ParseDashboard(kBad, "bad.json");
  ASSERT_THAT(d, IsOk());
  const std::vector<std::string> problems = LintDashboard(*d);
  const std::string all = absl::StrJoin(problems, "\n");
  for (const char* expected : {
           "bad.json: no uid",
           "schemaVersion 27",
           "no `datasource` variable",
           "variable worker reads from \"prom-1\"",
           "panel \"Twice\" has id 1",
           "type \"graph\"",
           "expr names no trident_* metric: up",
           "gridPos (x=20, y=0, w=8, h=8) is outside",
           "\"Twice\": datasource \"prom-1\"",
           "undefined variable $nope",
           "target A: refId empty or repeated",
           "\"Empty\": no targets",
       }) {
    EXPECT_THAT(all, HasSubstr(expected));
  }
  EXPECT_EQ(problems.size(), 12u) << all;
}

TEST(GrafanaDashboardTest, FindsVariablesInEveryGrafanaSyntax) {
  EXPECT_THAT(VariablesIn("rate(x{a=~\"$class\", b=\"${worker:regex}\"}[$__rate_interval]) "
                          "> [[slo]] and y{c=\"cost$\"}"),
              UnorderedElementsAre("class", "worker", "__rate_interval", "slo"));
  EXPECT_THAT(VariablesIn("sum(up)"), IsEmpty());
}

TEST(GrafanaDashboardTest, ExpandsVariablesAndNamesAMissingOne) {
  const std::map<std::string, std::string> values = {
      {"class", ".*"}, {"worker", "w-1"}, {"__rate_interval", "15s"}};
  EXPECT_THAT(
      ExpandVariables("rate(x{a=~\"$class\", b=\"${worker:regex}\"}[$__rate_interval])", values),
      IsOkAndHolds(std::string("rate(x{a=~\".*\", b=\"w-1\"}[15s])")));
  EXPECT_THAT(ExpandVariables("x[[[worker]]]", values), IsOkAndHolds(std::string("x[w-1]")));
  EXPECT_THAT(ExpandVariables("no variables", values), IsOkAndHolds(std::string("no variables")));
  EXPECT_THAT(ExpandVariables("x{a=\"$classes\"}", values),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("$classes")));
}

TEST(GrafanaDashboardTest, SelectAllValuesUsesAllForQueriesAndTheSavedValueOtherwise) {
  absl::StatusOr<Dashboard> d = ParseDashboard(kGood, "good.json");
  ASSERT_THAT(d, IsOk());
  const std::map<std::string, std::string> values =
      SelectAllValues(*d, {{"__rate_interval", "15s"}});
  EXPECT_EQ(values.at("class"), ".+");
  EXPECT_EQ(values.at("slo"), "1");
  EXPECT_EQ(values.at("__rate_interval"), "15s");
  EXPECT_EQ(values.count("datasource"), 0u);
}

TEST(GrafanaDashboardTest, LabelValuesBecomesAGroupQuery) {
  EXPECT_THAT(LabelValuesQuery("label_values(trident_router_requests_total, class)"),
              IsOkAndHolds(std::string("group by (class) (trident_router_requests_total)")));
  EXPECT_THAT(LabelValuesQuery(" label_values(up{job=\"worker\"},process) "),
              IsOkAndHolds(std::string("group by (process) (up{job=\"worker\"})")));
  EXPECT_THAT(LabelValuesQuery("label_values(class)"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("without a metric")));
  EXPECT_THAT(LabelValuesQuery("query_result(up)"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(GrafanaDashboardTest, MetricNamesSkipLabelMatchersStringsAndVariables) {
  EXPECT_THAT(MetricNamesIn("histogram_quantile(0.9, sum by (le) (rate("
                            "trident_router_ttft_seconds_bucket{class=~\"trident_x\"}[1m]))) / "
                            "on() trident_worker_kv_cache_blocks + count({__name__=~'trident_.+'})"
                            " + $trident_var"),
              ElementsAre("trident_router_ttft_seconds_bucket", "trident_worker_kv_cache_blocks"));
  EXPECT_THAT(MetricNamesIn("sum(rate(up[5m]))"), IsEmpty());
}

}  // namespace
}  // namespace trident::testing
