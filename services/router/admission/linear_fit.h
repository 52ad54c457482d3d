#ifndef TRIDENT_SERVICES_ROUTER_ADMISSION_LINEAR_FIT_H_
#define TRIDENT_SERVICES_ROUTER_ADMISSION_LINEAR_FIT_H_

// A least-squares fit of y = theta . x over a sliding window of samples,
// regularised toward a prior, for the router's cost models (step time as a
// linear function of tokens, batch size and context tokens).
//
// The fit minimises
//
//   sum_i (y_i - theta . x_i)^2 + prior_weight * sum_j ((theta_j - prior_j) * scale_j)^2
//
// over the last `window` samples: ridge regression centred on the prior
// instead of on zero. `scale_j` is a typical magnitude of feature j (for
// example 1024 prompt tokens), so `prior_weight` reads as "the prior is worth
// this many samples at typical feature values". The consequences:
//   * With no samples the fit is the prior; with a few it moves part way; with
//     a full window of informative samples the prior's pull is negligible.
//   * The normal matrix X'X + prior_weight * diag(scale^2) is positive definite
//     for any samples (even all identical, or perfectly collinear features), so
//     the solve never fails and the coefficients stay finite. Features are
//     divided by `scale_j` before solving so that the matrix is well
//     conditioned whatever the units.
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

class WindowedRidgeFit {
 public:
  // REQUIRES: 1 <= num_features <= kMaxFitFeatures; window >= 1;
  // prior_weight > 0; every scale > 0 and every prior >= 0.
  WindowedRidgeFit(int num_features, std::size_t window, double prior_weight,
                   std::array<double, kMaxFitFeatures> prior,
                   std::array<double, kMaxFitFeatures> scale);

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
  std::array<double, kMaxFitFeatures> prior_;
  std::array<double, kMaxFitFeatures> scale_;
  std::array<double, kMaxFitFeatures> theta_;
  std::vector<Sample> samples_;  // Ring buffer of capacity window_.
  std::size_t next_ = 0;
  std::size_t count_ = 0;
};

}  // namespace trident::router::admission

#endif  // TRIDENT_SERVICES_ROUTER_ADMISSION_LINEAR_FIT_H_
