#include "common/fault/fault_points.h"

#include <signal.h>
#include <unistd.h>

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/logging/log.h"

namespace trident::fault {
namespace internal {
std::atomic<bool> any_armed{false};
}  // namespace internal

namespace {

enum class Action { kCrash, kHang, kFail };

// Set by SIGUSR2: points armed to wait for it act from then on.
std::atomic<bool> signalled{false};

void OnSigusr2(int) { signalled.store(true, std::memory_order_relaxed); }

struct Point {
  bool wait_for_signal = false;
  Action action = Action::kFail;
  int64_t skip = 0;
  int64_t passes = 0;
  int64_t actions = 0;
};

struct Registry {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, Point> points ABSL_GUARDED_BY(mu);
};

Registry& GetRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

}  // namespace

absl::Status ArmFaultPoints(absl::string_view spec) {
  absl::flat_hash_map<std::string, Point> points;
  for (absl::string_view entry : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> name_action = absl::StrSplit(entry, '=');
    Point p;
    absl::string_view action_text = name_action.second;
    if (absl::ConsumeSuffix(&action_text, "~")) p.wait_for_signal = true;
    std::pair<absl::string_view, absl::string_view> action_skip = absl::StrSplit(action_text, '@');
    if (action_skip.first == "crash") {
      p.action = Action::kCrash;
    } else if (action_skip.first == "hang") {
      p.action = Action::kHang;
    } else if (action_skip.first == "fail") {
      p.action = Action::kFail;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--fault_points: \"", entry, "\": want name=crash|hang|fail[@skip][~]"));
    }
    if (name_action.first.empty() ||
        (!action_skip.second.empty() && (!absl::SimpleAtoi(action_skip.second, &p.skip) ||
                                         p.skip < 0))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--fault_points: \"", entry, "\": want name=crash|hang|fail[@skip][~]"));
    }
    points[std::string(name_action.first)] = p;
  }
  for (const auto& [name, p] : points) {
    if (!p.wait_for_signal) continue;
    struct sigaction action = {};
    action.sa_handler = OnSigusr2;
    sigemptyset(&action.sa_mask);
    sigaction(SIGUSR2, &action, nullptr);
    break;
  }
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  r.points = std::move(points);
  internal::any_armed.store(!r.points.empty(), std::memory_order_relaxed);
  for (const auto& [name, p] : r.points) {
    TRIDENT_LOG(WARNING) << "fault point " << name << " is armed (after " << p.skip << " passes)";
  }
  return absl::OkStatus();
}

absl::Status HitFaultPoint(absl::string_view name) {
  Registry& r = GetRegistry();
  Action action;
  {
    absl::MutexLock lock(&r.mu);
    auto it = r.points.find(name);
    if (it == r.points.end()) return absl::OkStatus();
    Point& p = it->second;
    if (p.wait_for_signal && !signalled.load(std::memory_order_relaxed)) return absl::OkStatus();
    if (p.passes++ < p.skip) return absl::OkStatus();
    action = p.action;
    if (action != Action::kCrash) ++p.actions;
  }
  switch (action) {
    case Action::kCrash:
      TRIDENT_LOG(WARNING) << "fault point " << name << ": crashing (SIGKILL)";
      kill(getpid(), SIGKILL);
      for (;;) pause();
    case Action::kHang:
      TRIDENT_LOG(WARNING) << "fault point " << name << ": hanging this thread";
      for (;;) pause();
    case Action::kFail:
      break;
  }
  return absl::UnavailableError(absl::StrCat("fault point ", name, " failed this on purpose"));
}

int64_t FaultPointActions(absl::string_view name) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  auto it = r.points.find(name);
  return it == r.points.end() ? 0 : it->second.actions;
}

}  // namespace trident::fault
