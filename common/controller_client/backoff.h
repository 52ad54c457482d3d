#ifndef TRIDENT_COMMON_CONTROLLER_CLIENT_BACKOFF_H_
#define TRIDENT_COMMON_CONTROLLER_CLIENT_BACKOFF_H_

// Capped exponential backoff with jitter, for clients that retry a call or
// reconnect a stream: the n-th delay in a row is
//
//   min(initial * multiplier^(n-1), max) * (1 + jitter * u),  u uniform in [-1, 1]
//
// and Reset() starts the row again (after a success). The jitter comes from
// a generator seeded by the caller, so a test that fixes the seed sees the
// same delays every run, while processes seeded differently (e.g. from
// their incarnation) spread their retries instead of all reconnecting at
// once after a controller restart.

#include <cstdint>
#include <random>

#include "absl/time/time.h"

namespace trident::controller_client {

struct BackoffOptions {
  // The first delay after a success.
  absl::Duration initial = absl::Milliseconds(100);
  // Ceiling of the delay, before jitter.
  absl::Duration max = absl::Seconds(5);
  // Growth factor per attempt; >= 1.
  double multiplier = 2.0;
  // Fraction of the delay added or taken away at random, in [0, 1].
  double jitter = 0.2;
};

// Thread-compatible: one thread drives it.
class Backoff {
 public:
  // Out-of-range options are clamped: initial to at least 1 ms, max to at
  // least initial, multiplier to at least 1, jitter into [0, 1].
  Backoff(const BackoffOptions& options, uint64_t seed);

  // The delay before the next attempt; each call without a Reset grows it.
  absl::Duration Next();

  // Starts again from `initial` (call after a success).
  void Reset() { attempts_ = 0; }

  // Attempts since the last Reset.
  int attempts() const { return attempts_; }

 private:
  BackoffOptions options_;
  std::mt19937_64 rng_;
  int attempts_ = 0;
};

}  // namespace trident::controller_client

#endif  // TRIDENT_COMMON_CONTROLLER_CLIENT_BACKOFF_H_
