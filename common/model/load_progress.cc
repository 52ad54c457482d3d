#include "common/model/load_progress.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging/log.h"

namespace trident::model {
namespace {

constexpr double kKiB = 1024.0;
constexpr double kMiB = kKiB * 1024;
constexpr double kGiB = kMiB * 1024;
constexpr double kTiB = kGiB * 1024;

struct Unit {
  double size;
  const char* name;
  int decimals;
};

// The unit FormatBytes would use for `bytes`.
Unit UnitFor(double bytes) {
  if (bytes >= kTiB) return {kTiB, "TiB", 1};
  if (bytes >= kGiB) return {kGiB, "GiB", 1};
  if (bytes >= kMiB) return {kMiB, "MiB", 0};
  if (bytes >= kKiB) return {kKiB, "KiB", 0};
  return {1, "B", 0};
}

}  // namespace

std::string FormatBytes(double bytes) {
  const Unit unit = UnitFor(bytes);
  return absl::StrFormat("%.*f %s", unit.decimals, bytes / unit.size, unit.name);
}

LoadProgress::LoadProgress(uint64_t total_bytes, Clock* clock)
    : LoadProgress(total_bytes, clock, "") {}

LoadProgress::LoadProgress(uint64_t total_bytes, Clock* clock, std::string label)
    : total_bytes_(total_bytes),
      clock_(clock),
      label_(std::move(label)),
      start_(clock->Now()),
      last_log_(start_) {}

void LoadProgress::Add(uint64_t bytes) {
  const absl::Time now = clock_->Now();
  std::string line;
  {
    absl::MutexLock lock(&mu_);
    loaded_bytes_ += bytes;
    const bool just_completed = !completed_ && loaded_bytes_ >= total_bytes_;
    if (!just_completed && now - last_log_ < absl::Seconds(1)) return;
    completed_ = completed_ || just_completed;
    last_log_ = now;
    ++num_lines_logged_;
    line = LineLocked(now);
  }
  TRIDENT_LOG(INFO) << line;  // Outside the lock: logging writes to stderr.
}

uint64_t LoadProgress::loaded_bytes() const {
  absl::MutexLock lock(&mu_);
  return loaded_bytes_;
}

std::string LoadProgress::Line() const {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  return LineLocked(now);
}

int LoadProgress::num_lines_logged_for_testing() const {
  absl::MutexLock lock(&mu_);
  return num_lines_logged_;
}

std::string LoadProgress::LineLocked(absl::Time now) const {
  // An empty checkpoint is complete from the start.
  const double percent =
      total_bytes_ == 0 ? 100.0 : 100.0 * static_cast<double>(loaded_bytes_) / total_bytes_;
  const double seconds = absl::ToDoubleSeconds(now - start_);
  // Loaded and total share the total's unit: "1.2 of 2.8 GiB", "120 of 280 MiB".
  const Unit unit = UnitFor(static_cast<double>(total_bytes_));
  const std::string rate =
      seconds > 0 ? absl::StrCat(FormatBytes(loaded_bytes_ / seconds), "/s") : "-";
  return absl::StrFormat("%sloading weights: %d%% (%.*f of %.*f %s, %s)", label_,
                         static_cast<int>(std::floor(percent)), unit.decimals,
                         loaded_bytes_ / unit.size, unit.decimals, total_bytes_ / unit.size,
                         unit.name, rate);
}

}  // namespace trident::model
