#include "common/controller_client/backoff.h"

#include <algorithm>
#include <cmath>

namespace trident::controller_client {

Backoff::Backoff(const BackoffOptions& options, uint64_t seed) : options_(options), rng_(seed) {
  options_.initial = std::max(options_.initial, absl::Milliseconds(1));
  options_.max = std::max(options_.max, options_.initial);
  options_.multiplier = std::max(options_.multiplier, 1.0);
  options_.jitter = std::clamp(options_.jitter, 0.0, 1.0);
}

absl::Duration Backoff::Next() {
  // Growth stops at the ceiling; the exponent is capped so that the power
  // cannot overflow after many attempts.
  const double growth = std::pow(options_.multiplier, std::min(attempts_, 64));
  ++attempts_;
  const absl::Duration base = std::min(options_.initial * growth, options_.max);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  const double factor = 1.0 + options_.jitter * unit(rng_);
  return std::max(base * factor, absl::ZeroDuration());
}

}  // namespace trident::controller_client
