#ifndef TRIDENT_SERVICES_ROUTER_ADMISSION_LINEAR_FIT_H_
#define TRIDENT_SERVICES_ROUTER_ADMISSION_LINEAR_FIT_H_

// A least-squares fit of y = theta . x over a sliding window of samples,
// regularised toward a prior, for the router's cost models (step time as a
// linear function of tokens, batch size and context tokens).
//
// The fit minimises
//
//   sum_i (y_i - theta . x_i)^2 + w(n) * sum_j ((theta_j - prior_j) * scale_j)^2
//
// over the last `window` samples: ridge regression centred on the prior
// instead of on zero. `scale_j` is a typical magnitude of feature j (for
// example 1024 prompt tokens), so the weight reads as "the prior is worth
// this many samples at typical feature values". The weight fades as samples
// arrive,
//
//   w(n) = prior_weight * max(0, 1 - n / prior_fade_samples) + ridge,
//
// n being the samples held. The consequences:
//   * With no samples the fit is the prior; with a few it moves part way;
//     after `prior_fade_samples` only the small `ridge` remains, so a prior
//     far from the truth no longer biases the fit (a fixed weight would: its
//     pseudo-samples sit far from the data and pull the line).
//   * The normal matrix X'X + w(n) * diag(scale^2) is positive definite for
//     any samples (even all identical, or perfectly collinear features), so
//     the solve never fails and the coefficients stay finite: along a
//     direction the samples do not determine, the prior decides, whatever the
//     weight. Features are divided by `scale_j` before solving so that the
//     matrix is well conditioned whatever the units.
//   * No coefficient comes out negative (a cost never decreases with more
//     work): when the solve gives a negative coefficient, that feature is
//     pinned to zero and the rest are solved again (an active-set step of
//     non-negative least squares), falling back to a simpler model.
//
// Thread-compatible.

#include <array>
#include <cstddef>
#include <vector>

namespace trident::router::admission {

// At most this many features (a constant term counts as a feature).
inline constexpr int kMaxFitFeatures = 3;

// The prior of a fit and how strongly it holds.
struct FitPrior {
  // Prior coefficients, each >= 0.
  std::array<double, kMaxFitFeatures> values{};
  // Typical magnitude of each feature, each > 0.
  std::array<double, kMaxFitFeatures> scales{1, 1, 1};
  // Initial weight, in samples at typical feature values; >= 0.
  double weight = 2;
  // Samples over which the weight fades to `ridge`; >= 1.
  double fade_samples = 32;
  // Weight that stays, for conditioning; > 0.
  double ridge = 0.01;
};

class WindowedRidgeFit {
 public:
  // REQUIRES: 1 <= num_features <= kMaxFitFeatures; window >= 1; `prior` as
  // its fields say.
  WindowedRidgeFit(int num_features, std::size_t window, const FitPrior& prior);

  // Adds one observation and refits. The oldest sample leaves once `window`
  // are held. Non-finite values are ignored (returns false).
  bool Add(const std::array<double, kMaxFitFeatures>& x, double y);

  // Moves the prior (for example to a throughput the worker reports) and
  // refits. Ignored unless every value is finite and >= 0.
  void SetPrior(const std::array<double, kMaxFitFeatures>& prior);

  // The current coefficients; entries past num_features() are zero.
  const std::array<double, kMaxFitFeatures>& coefficients() const { return theta_; }

  // theta . x.
  double Predict(const std::array<double, kMaxFitFeatures>& x) const;

  int num_features() const { return num_features_; }
  std::size_t num_samples() const { return count_; }

 private:
  struct Sample {
    std::array<double, kMaxFitFeatures> x;
    double y;
  };

  void Refit();

  int num_features_;
  std::size_t window_;
  double prior_weight_;
  double fade_samples_;
  double ridge_;
  std::array<double, kMaxFitFeatures> prior_;
  std::array<double, kMaxFitFeatures> scale_;
  std::array<double, kMaxFitFeatures> theta_;
  std::vector<Sample> samples_;  // Ring buffer of capacity window_.
  std::size_t next_ = 0;
  std::size_t count_ = 0;
};

}  // namespace trident::router::admission

#endif  // TRIDENT_SERVICES_ROUTER_ADMISSION_LINEAR_FIT_H_
