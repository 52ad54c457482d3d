#include "common/time/clock.h"

#include "common/logging/log.h"

namespace trident {

Clock* Clock::Real() {
  static Clock* const clock = new RealClock();
  return clock;
}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::Advance(absl::Duration duration) {
  TRIDENT_CHECK(duration >= absl::ZeroDuration()) << "time only moves forward";
  absl::MutexLock lock(&mu_);
  now_ += duration;
}

void FakeClock::SetTime(absl::Time time) {
  absl::MutexLock lock(&mu_);
  TRIDENT_CHECK(time >= now_) << "time only moves forward";
  now_ = time;
}

}  // namespace trident
