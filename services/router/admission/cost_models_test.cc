#include "services/router/admission/cost_models.h"

#include <cmath>
#include <cstdint>
#include <iostream>
#include <random>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "services/router/admission/linear_fit.h"

namespace trident::router::admission {
namespace {

constexpr uint32_t kSeed = 20240601;

TEST(PrefillModelTest, StartsAtThePrior) {
  PrefillModelOptions options;
  options.prior_fixed_time = absl::Milliseconds(4);
  options.prior_tokens_per_second = 8000;
  PrefillModel model(options);
  EXPECT_DOUBLE_EQ(model.fixed_seconds(), 0.004);
  EXPECT_DOUBLE_EQ(model.seconds_per_token(), 1.0 / 8000);
  EXPECT_NEAR(model.PredictSeconds(8000), 1.004, 1e-12);
}

TEST(PrefillModelTest, RecoversKnownCoefficientsFromNoisySamples) {
  std::cout << "seed " << kSeed << "\n";
  std::mt19937 rng(kSeed);
  std::uniform_int_distribution<int64_t> tokens(64, 4096);
  std::normal_distribution<double> noise(1.0, 0.02);
  const double a = 0.020;
  const double b = 5e-5;  // 20,000 tokens/s.
  PrefillModel model;     // Default prior: 5 ms, 10,000 tokens/s (wrong on purpose).
  for (int i = 0; i < 128; ++i) {
    const int64_t n = tokens(rng);
    model.AddSample(n, absl::Seconds((a + b * n) * noise(rng)));
  }
  std::cout << "fitted a=" << model.fixed_seconds() << " b=" << model.seconds_per_token() << "\n";
  EXPECT_NEAR(model.fixed_seconds(), a, 0.10 * a);
  EXPECT_NEAR(model.seconds_per_token(), b, 0.03 * b);
  EXPECT_NEAR(model.PredictSeconds(2048), a + b * 2048, 0.02 * (a + b * 2048));
}

TEST(PrefillModelTest, ReportedThroughputMovesThePriorSlope) {
  PrefillModel model;
  model.SetReportedThroughput(40000);
  EXPECT_DOUBLE_EQ(model.seconds_per_token(), 1.0 / 40000);
  model.SetReportedThroughput(0);  // Ignored: the worker did no prefill.
  model.SetReportedThroughput(std::nan(""));
  EXPECT_DOUBLE_EQ(model.seconds_per_token(), 1.0 / 40000);
}

TEST(PrefillModelTest, IgnoresMeaninglessSamples) {
  PrefillModel model;
  model.AddSample(0, absl::Milliseconds(5));
  model.AddSample(100, absl::ZeroDuration());
  model.AddSample(-3, absl::Milliseconds(5));
  EXPECT_EQ(model.num_samples(), 0u);
}

TEST(DecodeModelTest, RecoversKnownCoefficientsFromNoisySamples) {
  std::cout << "seed " << kSeed << "\n";
  std::mt19937 rng(kSeed);
  std::uniform_int_distribution<int64_t> batch_dist(1, 64);
  // Mean context per sequence drawn per step, so that batch and context vary
  // independently enough to tell their costs apart (the collinear case is the
  // next test).
  std::uniform_int_distribution<int64_t> mean_context(100, 8000);
  std::normal_distribution<double> noise(1.0, 0.02);
  const double c0 = 0.012;
  const double c1 = 4e-4;
  const double c2 = 6e-8;
  DecodeModel model;  // Default prior 8 ms, 0.1 ms, 30 ns (wrong on purpose).
  for (int i = 0; i < 256; ++i) {
    const int64_t batch = batch_dist(rng);
    const int64_t context = batch * mean_context(rng);
    model.AddSample(batch, context, absl::Seconds((c0 + c1 * batch + c2 * context) * noise(rng)));
  }
  std::cout << "fitted c0=" << model.fixed_seconds() << " c1=" << model.seconds_per_sequence()
            << " c2=" << model.seconds_per_context_token() << "\n";
  EXPECT_NEAR(model.fixed_seconds(), c0, 0.05 * c0);
  EXPECT_NEAR(model.seconds_per_sequence(), c1, 0.15 * c1);
  EXPECT_NEAR(model.seconds_per_context_token(), c2, 0.15 * c2);
}

TEST(DecodeModelTest, StaysFiniteAndAccurateOnCollinearSamples) {
  // Every sequence has exactly 1000 tokens of context: batch and context
  // carry the same information, and plain least squares is singular.
  DecodeModel model;
  for (int64_t batch = 1; batch <= 32; ++batch) {
    model.AddSample(batch, 1000 * batch, absl::Seconds(0.010 + 0.001 * batch));
  }
  EXPECT_TRUE(std::isfinite(model.fixed_seconds()));
  EXPECT_TRUE(std::isfinite(model.seconds_per_sequence()));
  EXPECT_TRUE(std::isfinite(model.seconds_per_context_token()));
  EXPECT_GE(model.seconds_per_sequence(), 0);
  EXPECT_GE(model.seconds_per_context_token(), 0);
  // Where the samples are, the prediction is right whatever the split.
  EXPECT_NEAR(model.PredictSeconds(16, 16000), 0.026, 0.026 * 0.03);
}

TEST(DecodeModelTest, IdenticalSamplesGiveThatStepTimeThere) {
  DecodeModel model;
  for (int i = 0; i < 100; ++i) model.AddSample(8, 8000, absl::Milliseconds(20));
  EXPECT_NEAR(model.PredictSeconds(8, 8000), 0.020, 0.001);
  EXPECT_TRUE(std::isfinite(model.seconds_per_context_token()));
}

TEST(DecodeModelTest, FallsBackToFewerTermsRatherThanANegativeCost) {
  // Step time that falls with context (measurement artefact): the context
  // term is pinned at zero instead of going negative.
  DecodeModel model;
  std::mt19937 rng(kSeed);
  std::uniform_int_distribution<int64_t> batch_dist(1, 32);
  std::uniform_int_distribution<int64_t> context_dist(1000, 100000);
  for (int i = 0; i < 200; ++i) {
    const int64_t batch = batch_dist(rng);
    const int64_t context = context_dist(rng);
    model.AddSample(batch, context, absl::Seconds(0.05 + 0.001 * batch - 3e-7 * context));
  }
  EXPECT_EQ(model.seconds_per_context_token(), 0);
  EXPECT_GT(model.seconds_per_sequence(), 0);
  EXPECT_GT(model.PredictSeconds(1, 100000), 0);
}

TEST(DecodeModelTest, SlidingWindowForgetsOldBehaviour) {
  DecodeModelOptions options;
  options.window = 64;
  DecodeModel model(options);
  for (int i = 0; i < 64; ++i) {
    const int64_t batch = 1 + i % 32;
    model.AddSample(batch, 500 * batch + 37 * (i % 7), absl::Seconds(0.030 + 0.002 * batch));
  }
  for (int i = 0; i < 64; ++i) {
    const int64_t batch = 1 + i % 32;
    model.AddSample(batch, 500 * batch + 37 * (i % 7), absl::Seconds(0.010 + 0.001 * batch));
  }
  EXPECT_EQ(model.num_samples(), 64u);
  EXPECT_NEAR(model.PredictSeconds(16, 8000), 0.026, 0.026 * 0.03);
}

TEST(WindowedRidgeFitTest, PriorWeightIsWorthThatManySamplesAndFades) {
  // y = theta with one constant feature: the fit is the weighted mean of the
  // prior and the samples, the prior's weight 2 * (1 - n / 4) + 0.5.
  WindowedRidgeFit fit(
      1, 16, FitPrior{.values = {1.0, 0, 0}, .weight = 2, .fade_samples = 4, .ridge = 0.5});
  EXPECT_DOUBLE_EQ(fit.coefficients()[0], 1.0);
  fit.Add({1.0, 0, 0}, 4.0);
  fit.Add({1.0, 0, 0}, 4.0);
  EXPECT_NEAR(fit.coefficients()[0], (1.5 * 1.0 + 2 * 4.0) / 3.5, 1e-12);
  fit.Add({1.0, 0, 0}, 4.0);
  fit.Add({1.0, 0, 0}, 4.0);
  EXPECT_NEAR(fit.coefficients()[0], (0.5 * 1.0 + 4 * 4.0) / 4.5, 1e-12);
  EXPECT_FALSE(fit.Add({1.0, 0, 0}, std::nan("")));
  EXPECT_EQ(fit.num_samples(), 4u);
}

TEST(TtftForecastTest, TheScaleMultipliesWorkBeforeElapsedTimeIsTakenOff) {
  TtftForecast f;
  f.reported_work = 0.100;     // The last report's queue: 100 ms at the fitted rate,
  f.reported_elapsed = 0.050;  // received 50 ms ago.
  f.request_work = 0.020;
  EXPECT_NEAR(f.At(1), 0.050 + 0.020, 1e-12);
  // At half speed the queue holds 200 ms of work, 50 of them done.
  EXPECT_NEAR(f.At(2), 0.150 + 0.040, 1e-12);
  // At twice the speed it is done.
  EXPECT_NEAR(f.At(0.5), 0.010, 1e-12);
  // The router's own view of the backlog wins when larger.
  f.own_work = 0.300;
  f.own_elapsed = 0.100;
  EXPECT_NEAR(f.At(1), 0.200 + 0.020, 1e-12);
  EXPECT_NEAR(f.At(2), 0.500 + 0.040, 1e-12);
  // Prompts admitted after the report add to its view at the same scale.
  f.own_work = 0;
  f.since_work = 0.010;
  EXPECT_NEAR(f.At(2), 0.150 + 0.020 + 0.040, 1e-12);
}

TEST(TtftForecastTest, ScaleForInvertsAtOnEverySegment) {
  TtftForecast f;
  f.reported_work = 0.100;
  f.reported_elapsed = 0.050;
  f.own_work = 0.080;
  f.own_elapsed = 0.010;
  f.request_work = 0.020;
  for (double scale : {0.05, 0.3, 0.5, 0.9, 1.0, 1.7, 3.0, 250.0}) {
    EXPECT_NEAR(f.ScaleFor(f.At(scale)), scale, 1e-5 * scale) << "scale " << scale;
  }
  EXPECT_EQ(f.ScaleFor(0), 0);
  EXPECT_EQ(f.ScaleFor(-1), 0);
  EXPECT_EQ(f.ScaleFor(1e9), TtftForecast::kMaxScale);
}

TEST(TransferModelTest, BytesPerTokenOfLlama3With8B) {
  // 32 layers, 8 KV heads of 128, bf16: 128 KiB per token.
  EXPECT_EQ(KvBytesPerToken(32, 8, 128, 2), 131072);
}

TEST(TransferModelTest, StartsAtPriorAndConvergesToMeasuredBandwidth) {
  TransferModelOptions options;
  options.bytes_per_token = 131072;
  options.prior_gigabytes_per_second = 10;
  options.fixed_latency = absl::Milliseconds(1);
  TransferModel model(options);
  EXPECT_NEAR(model.PredictSeconds(1000), 0.001 + 131072e3 / 10e9, 1e-12);
  for (int i = 0; i < 60; ++i) {
    // 25 GB/s: 250 MB in 10 ms plus the fixed latency.
    model.Observe(250'000'000, absl::Milliseconds(11));
  }
  EXPECT_NEAR(model.gigabytes_per_second(), 25, 0.01);
  EXPECT_NEAR(model.PredictSeconds(1000), 0.001 + 131072e3 / 25e9, 1e-6);
  model.Observe(1000, absl::Microseconds(500));  // Within the latency: ignored.
  EXPECT_NEAR(model.gigabytes_per_second(), 25, 0.01);
}

TEST(TransferModelTest, FreeWhenNoBytesMove) {
  TransferModel model;  // bytes_per_token 0: colocated or unknown.
  EXPECT_EQ(model.PredictSeconds(4096), 0);
}

}  // namespace
}  // namespace trident::router::admission
