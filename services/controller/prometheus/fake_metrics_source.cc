#include "services/controller/prometheus/fake_metrics_source.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trident::controller {
namespace {

// The sample of `series` in effect at `time`: the latest at or before it,
// at most `lookback` old.
std::optional<Sample> SampleAt(const Series& series, absl::Time time, absl::Duration lookback) {
  const auto after =
      std::upper_bound(series.samples.begin(), series.samples.end(), time,
                       [](absl::Time t, const Sample& sample) { return t < sample.time; });
  if (after == series.samples.begin()) return std::nullopt;
  const Sample& latest = *std::prev(after);
  if (time - latest.time > lookback) return std::nullopt;
  return latest;
}

Series* FindSeries(std::vector<Series>& all, const Labels& labels) {
  for (Series& series : all) {
    if (series.labels == labels) return &series;
  }
  return nullptr;
}

}  // namespace

FakeMetricsSource::FakeMetricsSource(const Clock* clock, std::string name)
    : clock_(clock), name_(std::move(name)) {}

void FakeMetricsSource::AddSample(const std::string& promql, const Labels& labels, absl::Time time,
                                  double value) {
  absl::MutexLock lock(&mu_);
  std::vector<Series>& all = stored_[promql];
  Series* series = FindSeries(all, labels);
  if (series == nullptr) {
    all.push_back(Series{.labels = labels});
    series = &all.back();
  }
  series->samples.push_back(Sample{time, value});
}

void FakeMetricsSource::Set(const std::string& promql, double value, const Labels& labels) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  std::vector<Series>& all = stored_[promql];
  Series* series = FindSeries(all, labels);
  if (series == nullptr) {
    all.push_back(Series{.labels = labels});
    series = &all.back();
  }
  series->samples = {Sample{now, value}};
}

void FakeMetricsSource::Remove(const std::string& promql) {
  absl::MutexLock lock(&mu_);
  stored_.erase(promql);
}

void FakeMetricsSource::SetError(absl::Status status) {
  absl::MutexLock lock(&mu_);
  error_ = std::move(status);
}

void FakeMetricsSource::SetQueryError(const std::string& promql, absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (status.ok()) {
    query_errors_.erase(promql);
  } else {
    query_errors_[promql] = std::move(status);
  }
}

std::vector<std::string> FakeMetricsSource::queries() const {
  absl::MutexLock lock(&mu_);
  return queries_;
}

absl::Status FakeMetricsSource::Admit(const std::string& promql) {
  queries_.push_back(promql);
  if (!error_.ok()) return error_;
  if (promql.empty()) return absl::InvalidArgumentError("empty PromQL query");
  const auto failure = query_errors_.find(promql);
  return failure == query_errors_.end() ? absl::OkStatus() : failure->second;
}

absl::StatusOr<QueryResult> FakeMetricsSource::Query(const InstantQuery& query) {
  const absl::Time time = query.time.value_or(clock_->Now());
  absl::MutexLock lock(&mu_);
  if (absl::Status admitted = Admit(query.promql); !admitted.ok()) return admitted;
  QueryResult result{.type = ResultType::kVector};
  const auto stored = stored_.find(query.promql);
  if (stored == stored_.end()) return result;
  for (const Series& series : stored->second) {
    const std::optional<Sample> sample = SampleAt(series, time, kLookback);
    if (sample.has_value()) result.series.push_back(Series{series.labels, {*sample}});
  }
  return result;
}

absl::StatusOr<QueryResult> FakeMetricsSource::QueryRange(const RangeQuery& query) {
  if (query.end < query.start || query.step <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("range query `", query.promql, "`: needs start <= end and step > 0"));
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status admitted = Admit(query.promql); !admitted.ok()) return admitted;
  QueryResult result{.type = ResultType::kMatrix};
  const auto stored = stored_.find(query.promql);
  if (stored == stored_.end()) return result;
  for (const Series& series : stored->second) {
    Series answer{.labels = series.labels};
    for (absl::Time t = query.start; t <= query.end; t += query.step) {
      const std::optional<Sample> sample = SampleAt(series, t, kLookback);
      if (sample.has_value()) answer.samples.push_back(Sample{t, sample->value});
    }
    if (!answer.samples.empty()) result.series.push_back(std::move(answer));
  }
  return result;
}

}  // namespace trident::controller
