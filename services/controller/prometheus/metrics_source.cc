#include "services/controller/prometheus/metrics_source.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trident::controller {

absl::string_view ResultTypeName(ResultType type) {
  switch (type) {
    case ResultType::kVector:
      return "vector";
    case ResultType::kMatrix:
      return "matrix";
    case ResultType::kScalar:
      return "scalar";
    case ResultType::kString:
      return "string";
  }
  return "unknown";
}

absl::StatusOr<double> SingleValue(const QueryResult& result, absl::string_view what) {
  if (result.type == ResultType::kString) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": a string result (\"", result.string_value, "\"), not a number"));
  }
  if (result.series.empty()) {
    return absl::NotFoundError(absl::StrCat(what, ": no series"));
  }
  if (result.series.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", result.series.size(), " series where one was expected, e.g. ",
        LabelsToString(result.series[0].labels), " and ", LabelsToString(result.series[1].labels)));
  }
  const Series& series = result.series[0];
  if (series.samples.empty()) {
    return absl::NotFoundError(
        absl::StrCat(what, ": series ", LabelsToString(series.labels), " has no samples"));
  }
  return series.samples.back().value;
}

std::string LabelsToString(const Labels& labels) {
  return absl::StrCat(
      "{",
      absl::StrJoin(labels, ", ",
                    [](std::string* out, const std::pair<const std::string, std::string>& label) {
                      absl::StrAppend(out, label.first, "=\"", label.second, "\"");
                    }),
      "}");
}

}  // namespace trident::controller
