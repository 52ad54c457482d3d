#include "tests/testing/grafana_dashboard.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace trident::testing {
namespace {

using json = nlohmann::json;

constexpr absl::string_view kDatasourceRef = "${datasource}";
constexpr int kGridColumns = 24;

bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// `object[key]` as a string: empty when absent or null; an error for
// another type.
absl::StatusOr<std::string> StringField(const json& object, const char* key,
                                        const std::string& where) {
  if (!object.is_object() || !object.contains(key) || object[key].is_null()) return std::string();
  const json& value = object[key];
  if (!value.is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"", key, "\" is not a string"));
  }
  return value.get<std::string>();
}

// False when absent; kInvalidArgument for a value that is not a boolean.
absl::StatusOr<bool> BoolField(const json& object, const char* key, const std::string& where) {
  if (!object.is_object() || !object.contains(key) || object[key].is_null()) return false;
  const json& value = object[key];
  if (!value.is_boolean()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"", key, "\" is not a boolean"));
  }
  return value.get<bool>();
}

absl::StatusOr<int64_t> IntField(const json& object, const char* key, const std::string& where) {
  if (!object.is_object() || !object.contains(key) || object[key].is_null()) return 0;
  const json& value = object[key];
  if (!value.is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"", key, "\" is not an integer"));
  }
  return value.get<int64_t>();
}

// A datasource reference: {"type": ..., "uid": ...}, or a bare string (the
// schema before 8.3), or absent.
absl::StatusOr<std::string> DatasourceUid(const json& object, const std::string& where) {
  if (!object.contains("datasource") || object["datasource"].is_null()) return std::string();
  const json& ds = object["datasource"];
  if (ds.is_string()) return ds.get<std::string>();
  return StringField(ds, "uid", absl::StrCat(where, ".datasource"));
}

absl::StatusOr<DashboardVariable> ParseVariable(const json& v, const std::string& where) {
  DashboardVariable variable;
  TRIDENT_ASSIGN_OR_RETURN(variable.name, StringField(v, "name", where));
  TRIDENT_ASSIGN_OR_RETURN(variable.type, StringField(v, "type", where));
  // A query variable's query is an object ({"query": "label_values(...)"})
  // in current schemas, a string in older ones.
  if (v.contains("query") && v["query"].is_object()) {
    TRIDENT_ASSIGN_OR_RETURN(variable.query, StringField(v["query"], "query", where + ".query"));
  } else {
    TRIDENT_ASSIGN_OR_RETURN(variable.query, StringField(v, "query", where));
  }
  TRIDENT_ASSIGN_OR_RETURN(variable.datasource_uid, DatasourceUid(v, where));
  TRIDENT_ASSIGN_OR_RETURN(variable.all_value, StringField(v, "allValue", where));
  TRIDENT_ASSIGN_OR_RETURN(variable.include_all, BoolField(v, "includeAll", where));
  if (v.contains("current") && v["current"].is_object() && v["current"].contains("value")) {
    const json& value = v["current"]["value"];
    if (value.is_string()) variable.current = value.get<std::string>();
    if (value.is_array() && !value.empty() && value[0].is_string()) {
      variable.current = value[0].get<std::string>();
    }
  }
  return variable;
}

absl::StatusOr<DashboardTarget> ParseTarget(const json& t, const std::string& where) {
  DashboardTarget target;
  TRIDENT_ASSIGN_OR_RETURN(target.ref_id, StringField(t, "refId", where));
  TRIDENT_ASSIGN_OR_RETURN(target.expr, StringField(t, "expr", where));
  TRIDENT_ASSIGN_OR_RETURN(target.datasource_uid, DatasourceUid(t, where));
  TRIDENT_ASSIGN_OR_RETURN(target.instant, BoolField(t, "instant", where));
  return target;
}

absl::Status ParsePanels(const json& panels, const std::string& where,
                         std::vector<DashboardPanel>* out) {
  if (panels.is_null()) return absl::OkStatus();
  if (!panels.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(where, " is not an array"));
  }
  for (size_t i = 0; i < panels.size(); ++i) {
    const json& p = panels[i];
    const std::string at = absl::StrCat(where, "[", i, "]");
    if (!p.is_object()) return absl::InvalidArgumentError(absl::StrCat(at, " is not an object"));
    DashboardPanel panel;
    TRIDENT_ASSIGN_OR_RETURN(panel.id, IntField(p, "id", at));
    TRIDENT_ASSIGN_OR_RETURN(panel.type, StringField(p, "type", at));
    TRIDENT_ASSIGN_OR_RETURN(panel.title, StringField(p, "title", at));
    TRIDENT_ASSIGN_OR_RETURN(panel.datasource_uid, DatasourceUid(p, at));
    if (p.contains("gridPos")) {
      const json& g = p["gridPos"];
      const std::string grid = at + ".gridPos";
      TRIDENT_ASSIGN_OR_RETURN(const int64_t x, IntField(g, "x", grid));
      TRIDENT_ASSIGN_OR_RETURN(const int64_t y, IntField(g, "y", grid));
      TRIDENT_ASSIGN_OR_RETURN(const int64_t w, IntField(g, "w", grid));
      TRIDENT_ASSIGN_OR_RETURN(const int64_t h, IntField(g, "h", grid));
      panel.x = static_cast<int32_t>(x);
      panel.y = static_cast<int32_t>(y);
      panel.w = static_cast<int32_t>(w);
      panel.h = static_cast<int32_t>(h);
    }
    if (p.contains("targets") && !p["targets"].is_null()) {
      if (!p["targets"].is_array()) {
        return absl::InvalidArgumentError(absl::StrCat(at, ".targets is not an array"));
      }
      for (size_t j = 0; j < p["targets"].size(); ++j) {
        TRIDENT_ASSIGN_OR_RETURN(
            DashboardTarget target,
            ParseTarget(p["targets"][j], absl::StrCat(at, ".targets[", j, "]")));
        panel.targets.push_back(std::move(target));
      }
    }
    out->push_back(std::move(panel));
    if (p.contains("panels"))
      TRIDENT_RETURN_IF_ERROR(ParsePanels(p["panels"], at + ".panels", out));
  }
  return absl::OkStatus();
}

// Calls `on_variable(begin, end, name)` for each variable reference in
// `expr`: `$name`, `${name}`, `${name:format}`, `[[name]]`; [begin, end) is
// the reference's text.
template <typename F>
void ForEachVariable(absl::string_view expr, F on_variable) {
  size_t i = 0;
  while (i < expr.size()) {
    size_t begin = i;
    size_t name_begin = 0, name_end = 0, end = 0;
    if (expr[i] == '$' && i + 1 < expr.size() && expr[i + 1] == '{') {
      const size_t close = expr.find('}', i + 2);
      if (close == absl::string_view::npos) break;
      name_begin = i + 2;
      name_end = std::min(close, expr.find(':', name_begin));
      end = close + 1;
    } else if (expr[i] == '$') {
      name_begin = name_end = i + 1;
      while (name_end < expr.size() && IsNameChar(expr[name_end])) ++name_end;
      end = name_end;
    } else if (expr.substr(i, 2) == "[[") {
      const size_t close = expr.find("]]", i + 2);
      if (close == absl::string_view::npos) break;
      name_begin = i + 2;
      name_end = std::min(close, expr.find(':', name_begin));
      end = close + 2;
    } else {
      ++i;
      continue;
    }
    const absl::string_view name = expr.substr(name_begin, name_end - name_begin);
    if (!name.empty() && std::all_of(name.begin(), name.end(), IsNameChar)) {
      on_variable(begin, end, std::string(name));
      i = end;
    } else {
      i = begin + 1;
    }
  }
}

void LintPanel(const Dashboard& d, const DashboardPanel& panel,
               std::vector<std::string>* problems) {
  const std::string where = absl::StrCat(d.source, ": panel ", panel.id, " \"", panel.title, "\"");
  if (panel.w <= 0 || panel.h <= 0 || panel.x < 0 || panel.y < 0 ||
      panel.x + panel.w > kGridColumns) {
    problems->push_back(absl::StrCat(where, ": gridPos (x=", panel.x, ", y=", panel.y,
                                     ", w=", panel.w, ", h=", panel.h, ") is outside the ",
                                     kGridColumns, "-column grid"));
  }
  if (panel.title.empty()) problems->push_back(absl::StrCat(where, ": no title"));
  if (panel.type == "row") {
    if (!panel.targets.empty()) problems->push_back(absl::StrCat(where, ": a row has targets"));
    return;
  }
  if (panel.type != "timeseries" && panel.type != "stat") {
    problems->push_back(
        absl::StrCat(where, ": type \"", panel.type, "\" (want timeseries or stat)"));
  }
  if (panel.datasource_uid != kDatasourceRef) {
    problems->push_back(absl::StrCat(where, ": datasource \"", panel.datasource_uid, "\" (want ",
                                     kDatasourceRef, ")"));
  }
  if (panel.targets.empty()) problems->push_back(absl::StrCat(where, ": no targets"));
  std::set<std::string> ref_ids;
  for (const DashboardTarget& target : panel.targets) {
    const std::string at = absl::StrCat(where, " target ", target.ref_id);
    if (target.ref_id.empty() || !ref_ids.insert(target.ref_id).second) {
      problems->push_back(absl::StrCat(at, ": refId empty or repeated"));
    }
    if (!target.datasource_uid.empty() && target.datasource_uid != kDatasourceRef) {
      problems->push_back(absl::StrCat(at, ": datasource \"", target.datasource_uid, "\" (want ",
                                       kDatasourceRef, ")"));
    }
    if (MetricNamesIn(target.expr).empty()) {
      problems->push_back(absl::StrCat(at, ": expr names no trident_* metric: ", target.expr));
    }
    for (const std::string& name : VariablesIn(target.expr)) {
      if (d.FindVariable(name) == nullptr && BuiltinVariables().count(name) == 0) {
        problems->push_back(absl::StrCat(at, ": undefined variable $", name));
      }
    }
  }
}

}  // namespace

const DashboardVariable* Dashboard::FindVariable(absl::string_view name) const {
  for (const DashboardVariable& v : variables) {
    if (v.name == name) return &v;
  }
  return nullptr;
}

absl::StatusOr<Dashboard> ParseDashboard(absl::string_view json_text, absl::string_view source) {
  const json root = json::parse(json_text.begin(), json_text.end(), nullptr,
                                /*allow_exceptions=*/false);
  const std::string where(source);
  if (root.is_discarded()) return absl::InvalidArgumentError(where + ": not valid JSON");
  if (!root.is_object()) return absl::InvalidArgumentError(where + ": not a JSON object");
  Dashboard d;
  d.source = where;
  TRIDENT_ASSIGN_OR_RETURN(d.uid, StringField(root, "uid", where));
  TRIDENT_ASSIGN_OR_RETURN(d.title, StringField(root, "title", where));
  TRIDENT_ASSIGN_OR_RETURN(const int64_t schema, IntField(root, "schemaVersion", where));
  d.schema_version = static_cast<int32_t>(schema);
  if (root.contains("templating") && root["templating"].contains("list")) {
    const json& list = root["templating"]["list"];
    if (!list.is_array()) {
      return absl::InvalidArgumentError(where + ": templating.list is not an array");
    }
    for (size_t i = 0; i < list.size(); ++i) {
      TRIDENT_ASSIGN_OR_RETURN(
          DashboardVariable v,
          ParseVariable(list[i], absl::StrCat(where, ": templating.list[", i, "]")));
      d.variables.push_back(std::move(v));
    }
  }
  if (root.contains("panels")) {
    TRIDENT_RETURN_IF_ERROR(ParsePanels(root["panels"], where + ": panels", &d.panels));
  }
  return d;
}

absl::StatusOr<Dashboard> LoadDashboard(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return ParseDashboard(text.str(), std::filesystem::path(path).filename().string());
}

absl::StatusOr<std::vector<Dashboard>> LoadDashboards(const std::string& dir) {
  std::error_code error;
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    if (entry.path().extension() == ".json") paths.push_back(entry.path().string());
  }
  if (error) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", error.message()));
  std::sort(paths.begin(), paths.end());
  std::vector<Dashboard> dashboards;
  for (const std::string& path : paths) {
    TRIDENT_ASSIGN_OR_RETURN(Dashboard d, LoadDashboard(path));
    dashboards.push_back(std::move(d));
  }
  return dashboards;
}

std::vector<std::string> LintDashboard(const Dashboard& d) {
  std::vector<std::string> problems;
  if (d.uid.empty()) problems.push_back(d.source + ": no uid");
  if (d.title.empty()) problems.push_back(d.source + ": no title");
  if (d.schema_version < 36) {
    problems.push_back(absl::StrCat(d.source, ": schemaVersion ", d.schema_version,
                                    " (want 36 or later: Grafana 9+)"));
  }
  const DashboardVariable* datasource = d.FindVariable("datasource");
  if (datasource == nullptr || datasource->type != "datasource" ||
      datasource->query != "prometheus") {
    problems.push_back(d.source + ": no `datasource` variable of type datasource for prometheus");
  }
  for (const DashboardVariable& v : d.variables) {
    if (v.type == "query" && v.datasource_uid != kDatasourceRef) {
      problems.push_back(absl::StrCat(d.source, ": variable ", v.name, " reads from \"",
                                      v.datasource_uid, "\" (want ", kDatasourceRef, ")"));
    }
  }
  if (d.panels.empty()) problems.push_back(d.source + ": no panels");
  std::set<int64_t> ids;
  for (const DashboardPanel& panel : d.panels) {
    if (panel.id <= 0 || !ids.insert(panel.id).second) {
      problems.push_back(absl::StrCat(d.source, ": panel \"", panel.title, "\" has id ", panel.id,
                                      " (want unique and positive)"));
    }
    LintPanel(d, panel, &problems);
  }
  return problems;
}

const std::set<std::string>& BuiltinVariables() {
  static const auto* const kBuiltins = new std::set<std::string>{
      "__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms"};
  return *kBuiltins;
}

std::set<std::string> VariablesIn(absl::string_view expr) {
  std::set<std::string> names;
  ForEachVariable(expr, [&](size_t, size_t, std::string name) { names.insert(std::move(name)); });
  return names;
}

absl::StatusOr<std::string> ExpandVariables(absl::string_view expr,
                                            const std::map<std::string, std::string>& values) {
  std::string out;
  size_t copied = 0;
  absl::Status status;
  ForEachVariable(expr, [&](size_t begin, size_t end, const std::string& name) {
    if (!status.ok()) return;
    const auto it = values.find(name);
    if (it == values.end()) {
      status =
          absl::InvalidArgumentError(absl::StrCat("no value for variable $", name, " in: ", expr));
      return;
    }
    absl::StrAppend(&out, expr.substr(copied, begin - copied), it->second);
    copied = end;
  });
  if (!status.ok()) return status;
  absl::StrAppend(&out, expr.substr(copied));
  return out;
}

std::map<std::string, std::string> SelectAllValues(
    const Dashboard& dashboard, const std::map<std::string, std::string>& builtins) {
  std::map<std::string, std::string> values = builtins;
  for (const DashboardVariable& v : dashboard.variables) {
    if (v.type == "query") {
      values[v.name] = v.all_value.empty() ? ".*" : v.all_value;
    } else if (v.type != "datasource") {
      values[v.name] = v.current;
    }
  }
  return values;
}

absl::StatusOr<std::string> LabelValuesQuery(absl::string_view variable_query) {
  absl::string_view q = absl::StripAsciiWhitespace(variable_query);
  if (!absl::ConsumePrefix(&q, "label_values(") || !absl::ConsumeSuffix(&q, ")")) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a label_values(metric, label) query: ", variable_query));
  }
  const size_t comma = q.rfind(',');
  if (comma == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("label_values without a metric: ", variable_query));
  }
  const absl::string_view metric = absl::StripAsciiWhitespace(q.substr(0, comma));
  const absl::string_view label = absl::StripAsciiWhitespace(q.substr(comma + 1));
  if (metric.empty() || label.empty() || !std::all_of(label.begin(), label.end(), IsNameChar)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a label_values(metric, label) query: ", variable_query));
  }
  return absl::StrCat("group by (", label, ") (", metric, ")");
}

std::set<std::string> MetricNamesIn(absl::string_view expr) {
  constexpr absl::string_view kPrefix = "trident_";
  std::set<std::string> names;
  int braces = 0;
  size_t i = 0;
  while (i < expr.size()) {
    const char c = expr[i];
    if (c == '"' || c == '\'' || c == '`') {
      // A quoted string: skip to its closing quote (backslash escapes; none
      // in raw backtick strings).
      ++i;
      while (i < expr.size() && expr[i] != c) i += (c != '`' && expr[i] == '\\') ? 2 : 1;
      ++i;
      continue;
    }
    if (c == '{') ++braces;
    if (c == '}') braces = std::max(0, braces - 1);
    if (IsNameChar(c) || c == ':') {
      size_t end = i;
      while (end < expr.size() && (IsNameChar(expr[end]) || expr[end] == ':')) ++end;
      const absl::string_view word = expr.substr(i, end - i);
      const bool variable = i > 0 && expr[i - 1] == '$';
      if (braces == 0 && !variable && absl::StartsWith(word, kPrefix)) {
        names.insert(std::string(word));
      }
      i = end;
      continue;
    }
    ++i;
  }
  return names;
}

}  // namespace trident::testing
