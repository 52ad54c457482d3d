#include "services/router/admission/linear_fit.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/logging/log.h"

namespace trident::router::admission {
namespace {

using Vec = std::array<double, kMaxFitFeatures>;
using Mat = std::array<Vec, kMaxFitFeatures>;

// Solves a * x = b for the `n` leading rows/columns by Gaussian elimination
// with partial pivoting. `a` is symmetric positive definite here (the ridge
// term guarantees it), so a pivot is never zero.
Vec Solve(Mat a, Vec b, int n) {
  for (int col = 0; col < n; ++col) {
    int pivot = col;
    for (int row = col + 1; row < n; ++row) {
      if (std::fabs(a[row][col]) > std::fabs(a[pivot][col])) pivot = row;
    }
    std::swap(a[col], a[pivot]);
    std::swap(b[col], b[pivot]);
    for (int row = col + 1; row < n; ++row) {
      const double f = a[row][col] / a[col][col];
      for (int k = col; k < n; ++k) a[row][k] -= f * a[col][k];
      b[row] -= f * b[col];
    }
  }
  Vec x{};
  for (int row = n - 1; row >= 0; --row) {
    double s = b[row];
    for (int k = row + 1; k < n; ++k) s -= a[row][k] * x[k];
    x[row] = s / a[row][row];
  }
  return x;
}

}  // namespace

WindowedRidgeFit::WindowedRidgeFit(int num_features, std::size_t window, const FitPrior& prior)
    : num_features_(num_features),
      window_(window),
      prior_weight_(prior.weight),
      fade_samples_(prior.fade_samples),
      ridge_(prior.ridge),
      prior_(prior.values),
      scale_(prior.scales),
      theta_{} {
  TRIDENT_CHECK(num_features >= 1 && num_features <= kMaxFitFeatures) << num_features;
  TRIDENT_CHECK(window >= 1);
  TRIDENT_CHECK(prior_weight_ >= 0 && fade_samples_ >= 1 && ridge_ > 0);
  for (int j = 0; j < num_features_; ++j) {
    TRIDENT_CHECK(scale_[j] > 0 && prior_[j] >= 0) << "feature " << j;
  }
  for (int j = num_features_; j < kMaxFitFeatures; ++j) {
    prior_[j] = 0;
    scale_[j] = 1;
  }
  samples_.reserve(window_);
  Refit();
}

bool WindowedRidgeFit::Add(const Vec& x, double y) {
  if (!std::isfinite(y)) return false;
  for (int j = 0; j < num_features_; ++j) {
    if (!std::isfinite(x[j])) return false;
  }
  Sample sample{x, y};
  if (samples_.size() < window_) {
    samples_.push_back(sample);
  } else {
    samples_[next_] = sample;
  }
  next_ = (next_ + 1) % window_;
  count_ = samples_.size();
  Refit();
  return true;
}

void WindowedRidgeFit::SetPrior(const Vec& prior) {
  for (int j = 0; j < num_features_; ++j) {
    if (!std::isfinite(prior[j]) || prior[j] < 0) return;
  }
  for (int j = 0; j < num_features_; ++j) prior_[j] = prior[j];
  Refit();
}

double WindowedRidgeFit::Predict(const Vec& x) const {
  double y = 0;
  for (int j = 0; j < num_features_; ++j) y += theta_[j] * x[j];
  return y;
}

void WindowedRidgeFit::Refit() {
  // Normal equations in scaled features z_j = x_j / scale_j, whose
  // coefficients are phi_j = theta_j * scale_j.
  const int n = num_features_;
  Mat zz{};
  Vec zy{};
  for (const Sample& s : samples_) {
    Vec z{};
    for (int j = 0; j < n; ++j) z[j] = s.x[j] / scale_[j];
    for (int r = 0; r < n; ++r) {
      zy[r] += z[r] * s.y;
      for (int c = 0; c < n; ++c) zz[r][c] += z[r] * z[c];
    }
  }
  const double weight =
      prior_weight_ * std::max(0.0, 1.0 - static_cast<double>(count_) / fade_samples_) + ridge_;
  for (int j = 0; j < n; ++j) {
    zz[j][j] += weight;
    zy[j] += weight * prior_[j] * scale_[j];
  }

  // Active set: features still free to take a nonzero coefficient.
  std::array<bool, kMaxFitFeatures> free{};
  for (int j = 0; j < n; ++j) free[j] = true;
  Vec phi{};
  for (int round = 0; round <= n; ++round) {
    std::array<int, kMaxFitFeatures> index{};
    int m = 0;
    for (int j = 0; j < n; ++j) {
      if (free[j]) index[m++] = j;
    }
    phi = Vec{};
    if (m == 0) break;
    Mat a{};
    Vec b{};
    for (int r = 0; r < m; ++r) {
      b[r] = zy[index[r]];
      for (int c = 0; c < m; ++c) a[r][c] = zz[index[r]][index[c]];
    }
    const Vec solved = Solve(a, b, m);
    int most_negative = -1;
    for (int r = 0; r < m; ++r) {
      phi[index[r]] = solved[r];
      if (solved[r] < 0 && (most_negative < 0 || solved[r] < phi[most_negative])) {
        most_negative = index[r];
      }
    }
    if (most_negative < 0) break;
    free[most_negative] = false;
  }
  for (int j = 0; j < kMaxFitFeatures; ++j) {
    theta_[j] = j < n ? std::max(0.0, phi[j]) / scale_[j] : 0.0;
  }
}

}  // namespace trident::router::admission
