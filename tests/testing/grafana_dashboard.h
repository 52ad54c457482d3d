// Grafana dashboards (deploy/grafana/*.json) as the tests see them: every
// panel's PromQL, the template variables those queries use, and the rules
// the project's dashboards follow (LintDashboard). The dashboard tests use it
// twice: statically, on the JSON alone, and live, running every query
// against the Prometheus of a loaded local cluster.
//
// What is read from a dashboard (Grafana's JSON model, schemaVersion 36 and
// later):
//
//   {"uid", "title", "schemaVersion",
//    "templating": {"list": [{"name", "type", "query", "datasource",
//                             "allValue", "current": {"value"}}]},
//    "panels": [{"id", "type", "title", "datasource": {"uid"},
//                "gridPos": {"x", "y", "w", "h"},
//                "targets": [{"refId", "expr", "instant", "datasource"}],
//                "panels": [...]}]}      <- a collapsed row's own panels
//
// Template variables appear in queries as `$name`, `${name}`,
// `${name:format}` or `[[name]]`; Grafana's built-ins ($__rate_interval,
// $__interval, $__range, ...) are variables too, whose values the caller
// supplies.

#ifndef TRIDENT_TESTS_TESTING_GRAFANA_DASHBOARD_H_
#define TRIDENT_TESTS_TESTING_GRAFANA_DASHBOARD_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trident::testing {

struct DashboardVariable {
  std::string name;
  // "datasource", "query", "custom", "interval", "constant", ...
  std::string type;
  // datasource: the plugin type ("prometheus"); query: the query text
  // (`label_values(metric, label)`); custom: comma-separated values.
  std::string query;
  // query: the datasource's uid ("${datasource}" in this project).
  std::string datasource_uid;
  // What "All" selects (query variables); empty when unset.
  std::string all_value;
  bool include_all = false;
  // The value saved with the dashboard (the first, for multi-value
  // variables); empty when none.
  std::string current;
};

struct DashboardTarget {
  std::string ref_id;
  std::string expr;
  // An instant query (Grafana's "Instant" toggle); else a range query.
  bool instant = false;
  // Empty when the target names no datasource of its own.
  std::string datasource_uid;
};

struct DashboardPanel {
  int64_t id = 0;
  std::string type;
  std::string title;
  std::string datasource_uid;
  int32_t x = 0, y = 0, w = 0, h = 0;
  std::vector<DashboardTarget> targets;
};

struct Dashboard {
  // Where it was read from, for messages (e.g. "overview.json").
  std::string source;
  std::string uid;
  std::string title;
  int32_t schema_version = 0;
  std::vector<DashboardVariable> variables;
  // Every panel in document order, rows included, a collapsed row's panels
  // after the row.
  std::vector<DashboardPanel> panels;

  // The variable named `name`, or null.
  const DashboardVariable* FindVariable(absl::string_view name) const;
};

// Parses a dashboard's JSON. kInvalidArgument, naming `source` and the
// place, when the text is not JSON or a field read above has the wrong type
// (a missing field reads as empty; LintDashboard judges it).
absl::StatusOr<Dashboard> ParseDashboard(absl::string_view json_text, absl::string_view source);

// Reads and parses the file at `path` (`source` is its file name).
// kNotFound when it cannot be read.
absl::StatusOr<Dashboard> LoadDashboard(const std::string& path);

// Every `*.json` file in `dir`, parsed, in file-name order. kNotFound when
// `dir` cannot be listed; a parse error of any file fails the whole call.
absl::StatusOr<std::vector<Dashboard>> LoadDashboards(const std::string& dir);

// The project's rules for a dashboard; one message per broken rule, each
// naming the dashboard and the panel, empty when it follows them all:
//   - a uid, a title and schemaVersion >= 36;
//   - a `datasource` variable of type datasource for Prometheus, and every
//     query variable reading from `${datasource}`;
//   - at least one panel; panel ids unique and positive; every panel inside
//     the 24-column grid with a positive size;
//   - every panel but rows is a timeseries or stat panel on `${datasource}`
//     with at least one target, refIds unique within it, every target with
//     an expr that names at least one trident_* metric, on `${datasource}`
//     when it names a datasource;
//   - every variable a query uses is defined or one of Grafana's built-ins.
std::vector<std::string> LintDashboard(const Dashboard& dashboard);

// Grafana's built-in variables this project's queries may use.
const std::set<std::string>& BuiltinVariables();

// The names of the variables `expr` uses, built-ins included, without `$`.
std::set<std::string> VariablesIn(absl::string_view expr);

// `expr` with every variable replaced by its value from `values`.
// kInvalidArgument naming the first variable `values` lacks.
absl::StatusOr<std::string> ExpandVariables(absl::string_view expr,
                                            const std::map<std::string, std::string>& values);

// Values that make each of `dashboard`'s own variables select everything it
// can: a query variable its "All" value (`.*` when it sets none), a custom
// variable its saved value; merged over `builtins` (e.g. {"__rate_interval",
// "15s"}), which supplies the built-ins.
std::map<std::string, std::string> SelectAllValues(
    const Dashboard& dashboard, const std::map<std::string, std::string>& builtins);

// A query variable's `label_values(metric, label)` as PromQL that returns
// one series per value: `group by (label) (metric)`. kInvalidArgument for
// any other query (label_values without a metric included).
absl::StatusOr<std::string> LabelValuesQuery(absl::string_view variable_query);

// The metric names `expr` reads: identifiers starting with `trident_`
// outside quoted strings and label matchers (`{...}`), e.g.
// "trident_router_ttft_seconds_bucket" for a histogram_quantile over it.
std::set<std::string> MetricNamesIn(absl::string_view expr);

}  // namespace trident::testing

#endif  // TRIDENT_TESTS_TESTING_GRAFANA_DASHBOARD_H_
