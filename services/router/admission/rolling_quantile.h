#ifndef TRIDENT_SERVICES_ROUTER_ADMISSION_ROLLING_QUANTILE_H_
#define TRIDENT_SERVICES_ROUTER_ADMISSION_ROLLING_QUANTILE_H_

// The q-quantile of a worker's latest outcomes (a measured TTFT over its
// forecast, a TPOT over its prediction), by which the admission controller
// scales its predictions: at most `window` outcomes, the newest, and none
// older than `max_age`, so that a worker is never judged on a past it has
// left. The quantile is the k-th smallest of the n outcomes held, k =
// ceil(q n) (at least 1); it is recomputed only after a change.
//
// Times are seconds on the caller's clock; they must not decrease from one
// Add to the next. Thread-compatible.

#include <deque>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace trident::router::admission {

class RollingQuantile {
 public:
  // `window` below 1 is taken as 1; `quantile` in (0, 1].
  RollingQuantile(int window, absl::Duration max_age, double quantile);

  // Adds an outcome observed at `now`; the oldest leaves past `window`.
  // Non-finite values are ignored.
  void Add(double now, double value);
  void Clear();

  // The quantile at `now` (dropping outcomes older than max_age), or `none`
  // when none is left.
  double Quantile(double now, double none);
  // The same, leaving the outcomes as they are (for const readers).
  double QuantileAt(double now, double none) const;

  int size() const { return static_cast<int>(outcomes_.size()); }

 private:
  // The k-th smallest of `values` (reordered).
  double Select(std::vector<double>& values) const;

  int window_;
  double max_age_seconds_;
  double quantile_;
  // (when, value), oldest first.
  std::deque<std::pair<double, double>> outcomes_;
  double cached_ = 0;
  bool dirty_ = false;
  std::vector<double> scratch_;
};

}  // namespace trident::router::admission

#endif  // TRIDENT_SERVICES_ROUTER_ADMISSION_ROLLING_QUANTILE_H_
