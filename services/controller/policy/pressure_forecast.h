#ifndef TRIDENT_SERVICES_CONTROLLER_POLICY_PRESSURE_FORECAST_H_
#define TRIDENT_SERVICES_CONTROLLER_POLICY_PRESSURE_FORECAST_H_

// The forecast the role policy acts on: where a pressure is heading, from
// the samples of a short window, so that a trend moves roles and a lone
// sample does not.
//
// Holt-style, computed afresh from the window each time (no state outside
// it, so the window alone decides):
//
//   level    = exponentially weighted mean of the samples, oldest first,
//              seeded with the oldest (weight `smoothing` on each newer one)
//   slope    = least-squares slope of value against time, per interval
//   forecast = max(0, level + slope * horizon)
//
// On 6 samples at the default smoothing 0.4: noise of standard deviation s
// around a steady value moves the forecast by about 0.6 s (the level's
// sqrt(0.4 / 1.6) = 0.5 s, the slope's 0.24 s per interval); a lone spike
// of +d in the newest sample moves it by about 0.54 d; a step of +d moves
// it by 0.54 d, 0.87 d and 1.04 d after one, two and three samples. The
// level alone trails a ramp by (1 - smoothing) / smoothing intervals; the
// slope makes up part of that.

#include <vector>

#include "absl/time/time.h"

namespace trident::controller {

struct PressureSample {
  absl::Time time;
  double value = 0;
};

struct ForecastOptions {
  // Weight of each newer sample in the level, in (0, 1].
  double smoothing = 0.4;
  // How far ahead, in intervals.
  double horizon_intervals = 1;
  // The sampling interval: the slope's unit.
  absl::Duration interval = absl::Seconds(10);
};

// The forecast from `samples` (oldest first, times increasing). With one
// sample, that sample; with none, 0.
double ForecastPressure(const std::vector<PressureSample>& samples, const ForecastOptions& options);

// The least-squares slope of `samples`, per `interval`; 0 with fewer than
// two distinct times.
double PressureSlope(const std::vector<PressureSample>& samples, absl::Duration interval);

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_POLICY_PRESSURE_FORECAST_H_
