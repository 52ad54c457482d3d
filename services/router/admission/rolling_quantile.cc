#include "services/router/admission/rolling_quantile.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace trident::router::admission {

RollingQuantile::RollingQuantile(int window, absl::Duration max_age, double quantile)
    : window_(std::max(1, window)),
      max_age_seconds_(absl::ToDoubleSeconds(max_age)),
      quantile_(quantile) {}

void RollingQuantile::Add(double now, double value) {
  if (!std::isfinite(value)) return;
  outcomes_.emplace_back(now, value);
  while (static_cast<int>(outcomes_.size()) > window_) outcomes_.pop_front();
  dirty_ = true;
}

void RollingQuantile::Clear() {
  outcomes_.clear();
  dirty_ = true;
}

double RollingQuantile::Select(std::vector<double>& values) const {
  const size_t k = static_cast<size_t>(std::ceil(quantile_ * static_cast<double>(values.size())));
  const size_t index = std::clamp<size_t>(k, 1, values.size()) - 1;
  std::nth_element(values.begin(), values.begin() + index, values.end());
  return values[index];
}

double RollingQuantile::Quantile(double now, double none) {
  while (!outcomes_.empty() && now - outcomes_.front().first > max_age_seconds_) {
    outcomes_.pop_front();
    dirty_ = true;
  }
  if (outcomes_.empty()) return none;
  if (dirty_) {
    scratch_.clear();
    for (const auto& [when, value] : outcomes_) scratch_.push_back(value);
    cached_ = Select(scratch_);
    dirty_ = false;
  }
  return cached_;
}

double RollingQuantile::QuantileAt(double now, double none) const {
  std::vector<double> values;
  for (const auto& [when, value] : outcomes_) {
    if (now - when <= max_age_seconds_) values.push_back(value);
  }
  return values.empty() ? none : Select(values);
}

}  // namespace trident::router::admission
