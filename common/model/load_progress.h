// Progress reporting while weights load:
//
//   I... load_progress.cc:42] loading weights: 43% (1.2 of 2.8 GiB, 850 MiB/s)
//
// logged at most once per second of `clock` time, and always once when the
// total is reached.

#ifndef TRIDENT_COMMON_MODEL_LOAD_PROGRESS_H_
#define TRIDENT_COMMON_MODEL_LOAD_PROGRESS_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/time/clock.h"

namespace trident::model {

// Thread-safe: loader threads may call Add() concurrently.
class LoadProgress {
 public:
  // `clock` must outlive this object. The start time is clock->Now().
  LoadProgress(uint64_t total_bytes, Clock* clock);
  // Lines begin with `label` (e.g. "rank 2: " for one of several loaders
  // logging at once).
  LoadProgress(uint64_t total_bytes, Clock* clock, std::string label);

  // Records `bytes` more loaded, and logs a line if a second has passed since
  // the last one or the total has just been reached. Bytes beyond the total
  // are counted (shown above 100%) but log no further completion line.
  void Add(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);

  uint64_t loaded_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

  // The line Add() logs for the current state, e.g.
  // "loading weights: 43% (1.2 of 2.8 GiB, 850 MiB/s)"; loaded and total
  // bytes are shown in the total's unit (GiB and TiB with one decimal, MiB,
  // KiB and B with none); the rate is "-" before any time has passed.
  std::string Line() const ABSL_LOCKS_EXCLUDED(mu_);

  // How many lines have been logged (for tests).
  int num_lines_logged_for_testing() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::string LineLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t total_bytes_;
  Clock* const clock_;
  const std::string label_;
  const absl::Time start_;
  mutable absl::Mutex mu_;
  uint64_t loaded_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_log_ ABSL_GUARDED_BY(mu_);
  bool completed_ ABSL_GUARDED_BY(mu_) = false;
  int num_lines_logged_ ABSL_GUARDED_BY(mu_) = 0;
};

// "850 MiB", "1.2 GiB", "512 B": the largest binary unit that keeps the
// number at least 1, one decimal for GiB and above, none below.
std::string FormatBytes(double bytes);

}  // namespace trident::model

#endif  // TRIDENT_COMMON_MODEL_LOAD_PROGRESS_H_
