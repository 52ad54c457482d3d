#include "services/controller/policy/pressure_forecast.h"

#include <vector>

#include "gtest/gtest.h"

namespace trident::controller {
namespace {

constexpr absl::Duration kInterval = absl::Seconds(10);

// Samples one interval apart, starting at an arbitrary time.
std::vector<PressureSample> Series(const std::vector<double>& values) {
  std::vector<PressureSample> samples;
  absl::Time t = absl::FromUnixSeconds(1'700'000'000);
  for (double v : values) {
    samples.push_back({t, v});
    t += kInterval;
  }
  return samples;
}

const ForecastOptions kDefaults{.smoothing = 0.4, .horizon_intervals = 1, .interval = kInterval};

TEST(PressureForecastTest, EmptyAndSingleSample) {
  EXPECT_EQ(ForecastPressure({}, kDefaults), 0);
  EXPECT_DOUBLE_EQ(ForecastPressure(Series({0.7}), kDefaults), 0.7);
}

TEST(PressureForecastTest, ConstantStaysConstant) {
  EXPECT_NEAR(ForecastPressure(Series({0.5, 0.5, 0.5, 0.5, 0.5, 0.5}), kDefaults), 0.5, 1e-12);
}

TEST(PressureForecastTest, SlopeIsPerIntervalWhateverTheSampleTimes) {
  EXPECT_NEAR(PressureSlope(Series({0.1, 0.2, 0.3, 0.4}), kInterval), 0.1, 1e-12);
  // Irregular times: the slope follows time, not the sample count.
  const absl::Time t0 = absl::FromUnixSeconds(0);
  EXPECT_NEAR(PressureSlope({{t0, 0}, {t0 + absl::Seconds(5), 0.05}, {t0 + absl::Seconds(30), 0.3}},
                            kInterval),
              0.1, 1e-12);
  EXPECT_EQ(PressureSlope({{t0, 1}, {t0, 2}}, kInterval), 0);
}

TEST(PressureForecastTest, RampIsForecastOneSlopeAheadOfItsLevel) {
  // 0.3, 0.4, ... 0.8: the level (0.66) trails the newest sample; the
  // forecast adds the slope (0.1 per interval) times the horizon.
  const std::vector<PressureSample> ramp = Series({0.3, 0.4, 0.5, 0.6, 0.7, 0.8});
  ForecastOptions level_only = kDefaults;
  level_only.horizon_intervals = 0;
  EXPECT_NEAR(ForecastPressure(ramp, level_only), 0.6617, 1e-4);
  EXPECT_NEAR(ForecastPressure(ramp, kDefaults), 0.7617, 1e-4);
  ForecastOptions further = kDefaults;
  further.horizon_intervals = 3;
  EXPECT_NEAR(ForecastPressure(ramp, further), 0.9617, 1e-4);
}

TEST(PressureForecastTest, LoneSpikeMovesItLessThanASustainedStep) {
  // The header's figures: a spike of d in the newest of 6 samples moves the
  // forecast by about 0.54 d; a step held for 3 samples by about 1.04 d.
  const double d = 1.0;
  const double spike = ForecastPressure(Series({0, 0, 0, 0, 0, d}), kDefaults);
  const double step3 = ForecastPressure(Series({0, 0, 0, d, d, d}), kDefaults);
  EXPECT_NEAR(spike, 0.54, 0.01);
  EXPECT_NEAR(step3, 1.04, 0.01);
}

TEST(PressureForecastTest, NeverNegative) {
  EXPECT_EQ(ForecastPressure(Series({0.9, 0.3, 0.0, 0.0}), kDefaults), 0);
}

TEST(PressureForecastTest, SmoothingOneAndNoHorizonIsTheLastSample) {
  const ForecastOptions raw{.smoothing = 1, .horizon_intervals = 0, .interval = kInterval};
  EXPECT_DOUBLE_EQ(ForecastPressure(Series({0.2, 0.9, 0.4}), raw), 0.4);
}

}  // namespace
}  // namespace trident::controller
