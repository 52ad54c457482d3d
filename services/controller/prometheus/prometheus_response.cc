#include "services/controller/prometheus/prometheus_response.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace trident::controller {
namespace {

using json = nlohmann::json;

// Bodies quoted in errors are cut here: an HTML error page says enough in
// its first lines.
constexpr size_t kMaxQuotedBody = 200;

std::string Excerpt(absl::string_view body) {
  if (body.size() <= kMaxQuotedBody) return std::string(body);
  return absl::StrCat(body.substr(0, kMaxQuotedBody), "...");
}

absl::Status Malformed(absl::string_view origin, absl::string_view what) {
  return absl::InternalError(absl::StrCat(origin, ": malformed API response: ", what));
}

absl::StatusCode CodeForError(absl::string_view error_type, int http_status) {
  if (error_type == "bad_data" || error_type == "execution") {
    return absl::StatusCode::kInvalidArgument;
  }
  if (error_type == "timeout" || error_type == "canceled" || error_type == "unavailable") {
    return absl::StatusCode::kUnavailable;
  }
  if (error_type == "internal") return absl::StatusCode::kInternal;
  return http_status >= 500 ? absl::StatusCode::kUnavailable : absl::StatusCode::kInvalidArgument;
}

absl::Status ApiError(const json& body, int http_status, absl::string_view origin) {
  const auto type = body.find("errorType");
  const auto error = body.find("error");
  const std::string error_type =
      type != body.end() && type->is_string() ? type->get<std::string>() : "";
  const std::string text =
      error != body.end() && error->is_string() ? error->get<std::string>() : "(no error text)";
  return absl::Status(CodeForError(error_type, http_status),
                      absl::StrCat(origin, ": HTTP ", http_status, ", ",
                                   error_type.empty() ? "error" : error_type, ": ", text));
}

// [<unix seconds>, "<value>"]
absl::StatusOr<Sample> ParseSample(const json& pair, absl::string_view origin) {
  if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number() || !pair[1].is_string()) {
    return Malformed(origin, absl::StrCat("a sample is not [time, \"value\"]: ", pair.dump()));
  }
  const double seconds = pair[0].get<double>();
  absl::StatusOr<double> value = ParseSampleValue(pair[1].get_ref<const std::string&>());
  if (!value.ok()) return Malformed(origin, value.status().message());
  // The API's times are milliseconds written as fractional seconds.
  return Sample{absl::FromUnixMillis(std::llround(seconds * 1000)), *value};
}

absl::StatusOr<Labels> ParseLabels(const json& metric, absl::string_view origin) {
  if (!metric.is_object()) return Malformed(origin, "\"metric\" is not an object");
  Labels labels;
  for (const auto& [name, value] : metric.items()) {
    if (!value.is_string()) return Malformed(origin, absl::StrCat("label ", name, " not a string"));
    labels[name] = value.get<std::string>();
  }
  return labels;
}

// One element of a vector or matrix result.
absl::StatusOr<Series> ParseSeries(const json& element, ResultType type, absl::string_view origin) {
  if (!element.is_object()) return Malformed(origin, "a result is not an object");
  Series series;
  const auto metric = element.find("metric");
  if (metric != element.end()) {
    TRIDENT_ASSIGN_OR_RETURN(series.labels, ParseLabels(*metric, origin));
  }
  if (type == ResultType::kVector) {
    const auto value = element.find("value");
    if (value == element.end()) return Malformed(origin, "a vector result has no \"value\"");
    TRIDENT_ASSIGN_OR_RETURN(Sample sample, ParseSample(*value, origin));
    series.samples.push_back(sample);
    return series;
  }
  const auto values = element.find("values");
  if (values == element.end() || !values->is_array()) {
    return Malformed(origin, "a matrix result has no \"values\" array");
  }
  series.samples.reserve(values->size());
  for (const json& pair : *values) {
    TRIDENT_ASSIGN_OR_RETURN(Sample sample, ParseSample(pair, origin));
    series.samples.push_back(sample);
  }
  return series;
}

absl::StatusOr<ResultType> ParseResultType(const json& data, absl::string_view origin) {
  const auto type = data.find("resultType");
  if (type == data.end() || !type->is_string()) return Malformed(origin, "no \"resultType\"");
  const std::string& name = type->get_ref<const std::string&>();
  for (ResultType t :
       {ResultType::kVector, ResultType::kMatrix, ResultType::kScalar, ResultType::kString}) {
    if (name == ResultTypeName(t)) return t;
  }
  return Malformed(origin, absl::StrCat("unknown resultType \"", name, "\""));
}

absl::StatusOr<QueryResult> ParseData(const json& data, absl::string_view origin) {
  if (!data.is_object()) return Malformed(origin, "no \"data\" object");
  QueryResult result;
  TRIDENT_ASSIGN_OR_RETURN(result.type, ParseResultType(data, origin));
  const auto found = data.find("result");
  if (found == data.end()) return Malformed(origin, "no \"result\"");
  const json& items = *found;
  if (result.type == ResultType::kScalar || result.type == ResultType::kString) {
    if (!items.is_array() || items.size() != 2 || !items[1].is_string()) {
      return Malformed(origin, absl::StrCat("a ", ResultTypeName(result.type),
                                            " result is not [time, \"value\"]"));
    }
    if (result.type == ResultType::kString) {
      result.string_value = items[1].get<std::string>();
      return result;
    }
    TRIDENT_ASSIGN_OR_RETURN(Sample sample, ParseSample(items, origin));
    result.series.push_back(Series{.samples = {sample}});
    return result;
  }
  if (!items.is_array()) return Malformed(origin, "\"result\" is not an array");
  result.series.reserve(items.size());
  for (const json& element : items) {
    TRIDENT_ASSIGN_OR_RETURN(Series series, ParseSeries(element, result.type, origin));
    result.series.push_back(std::move(series));
  }
  return result;
}

}  // namespace

absl::StatusOr<double> ParseSampleValue(absl::string_view text) {
  if (text == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (text == "+Inf") return std::numeric_limits<double>::infinity();
  if (text == "-Inf") return -std::numeric_limits<double>::infinity();
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || std::isnan(value) || std::isinf(value)) {
    return absl::InvalidArgumentError(absl::StrCat("not a sample value: \"", text, "\""));
  }
  return value;
}

absl::StatusOr<QueryResult> ParseQueryResponse(int http_status, absl::string_view body,
                                               absl::string_view origin) {
  const json parsed = json::parse(body, /*cb=*/nullptr, /*allow_exceptions=*/false);
  const bool success_status = http_status >= 200 && http_status < 300;
  if (parsed.is_discarded() || !parsed.is_object()) {
    if (http_status >= 500) {
      return absl::UnavailableError(
          absl::StrCat(origin, ": HTTP ", http_status, ": ", Excerpt(body)));
    }
    if (!success_status) {
      return absl::FailedPreconditionError(absl::StrCat(
          origin, ": HTTP ", http_status,
          " and not a Prometheus API answer (is the URL a Prometheus server?): ", Excerpt(body)));
    }
    return Malformed(origin, absl::StrCat("not a JSON object: ", Excerpt(body)));
  }
  const auto status = parsed.find("status");
  if (status == parsed.end() || !status->is_string()) return Malformed(origin, "no \"status\"");
  if (*status != "success") return ApiError(parsed, http_status, origin);
  const auto data = parsed.find("data");
  if (data == parsed.end()) return Malformed(origin, "no \"data\"");
  TRIDENT_ASSIGN_OR_RETURN(QueryResult result, ParseData(*data, origin));
  const auto warnings = parsed.find("warnings");
  if (warnings != parsed.end() && warnings->is_array()) {
    for (const json& warning : *warnings) {
      if (warning.is_string()) result.warnings.push_back(warning.get<std::string>());
    }
  }
  return result;
}

}  // namespace trident::controller
