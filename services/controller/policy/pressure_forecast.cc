#include "services/controller/policy/pressure_forecast.h"

#include <algorithm>

namespace trident::controller {

double PressureSlope(const std::vector<PressureSample>& samples, absl::Duration interval) {
  if (samples.size() < 2) return 0;
  // x in intervals since the oldest sample, which keeps the sums small.
  const absl::Time origin = samples.front().time;
  double mean_x = 0;
  double mean_y = 0;
  for (const PressureSample& sample : samples) {
    mean_x += absl::FDivDuration(sample.time - origin, interval);
    mean_y += sample.value;
  }
  mean_x /= static_cast<double>(samples.size());
  mean_y /= static_cast<double>(samples.size());
  double sxx = 0;
  double sxy = 0;
  for (const PressureSample& sample : samples) {
    const double dx = absl::FDivDuration(sample.time - origin, interval) - mean_x;
    sxx += dx * dx;
    sxy += dx * (sample.value - mean_y);
  }
  return sxx > 0 ? sxy / sxx : 0;
}

double ForecastPressure(const std::vector<PressureSample>& samples,
                        const ForecastOptions& options) {
  if (samples.empty()) return 0;
  double level = samples.front().value;
  for (size_t i = 1; i < samples.size(); ++i) {
    level += options.smoothing * (samples[i].value - level);
  }
  const double slope = PressureSlope(samples, options.interval);
  return std::max(0.0, level + slope * options.horizon_intervals);
}

}  // namespace trident::controller
