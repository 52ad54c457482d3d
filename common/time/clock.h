#ifndef TRIDENT_COMMON_TIME_CLOCK_H_
#define TRIDENT_COMMON_TIME_CLOCK_H_

// Time as a dependency. Code that reads the time takes a `Clock*`, so tests
// drive it with `FakeClock` and never sleep to make time pass.

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace trident {

// Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;

  // The current time.
  virtual absl::Time Now() const = 0;

  // The process-wide real clock. Never deleted.
  static Clock* Real();
};

// Wall time from absl::Now(). Thread-safe.
class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

// A clock that moves only when told to. Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}

  absl::Time Now() const override ABSL_LOCKS_EXCLUDED(mu_);

  // Moves the time forward by `duration`.
  // REQUIRES: duration >= absl::ZeroDuration().
  void Advance(absl::Duration duration) ABSL_LOCKS_EXCLUDED(mu_);

  // Sets the time. REQUIRES: `time` is not before Now().
  void SetTime(absl::Time time) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident

#endif  // TRIDENT_COMMON_TIME_CLOCK_H_
