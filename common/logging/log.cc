#include "common/logging/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

ABSL_FLAG(std::string, log_level, "info",
          "Least severe log level printed to stderr: debug, info, warning or error.");

namespace trident::log {
namespace {

std::atomic<int> min_severity{static_cast<int>(Severity::kInfo)};

char SeverityLetter(Severity severity) {
  switch (severity) {
    case Severity::kDebug:
      return 'D';
    case Severity::kInfo:
      return 'I';
    case Severity::kWarning:
      return 'W';
    case Severity::kError:
      return 'E';
    case Severity::kFatal:
      return 'F';
  }
  return '?';
}

absl::string_view Basename(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == absl::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

void SetMinSeverity(Severity severity) {
  min_severity.store(static_cast<int>(severity), std::memory_order_relaxed);
}

Severity MinSeverity() {
  return static_cast<Severity>(min_severity.load(std::memory_order_relaxed));
}

bool ParseSeverity(absl::string_view text, Severity* severity) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "debug") {
    *severity = Severity::kDebug;
  } else if (lower == "info") {
    *severity = Severity::kInfo;
  } else if (lower == "warning" || lower == "warn") {
    *severity = Severity::kWarning;
  } else if (lower == "error") {
    *severity = Severity::kError;
  } else {
    return false;
  }
  return true;
}

void InitLoggingFromFlags() {
  Severity severity;
  const std::string level = absl::GetFlag(FLAGS_log_level);
  if (!ParseSeverity(level, &severity)) {
    TRIDENT_LOG(FATAL) << "--log_level=" << level
                       << " is not one of debug, info, warning, error";
  }
  SetMinSeverity(severity);
}

namespace internal {

LogMessage::LogMessage(const char* file, int line, Severity severity) : severity_(severity) {
  stream_ << SeverityLetter(severity)
          << absl::FormatTime("%Y%m%d %H:%M:%E6S", absl::Now(), absl::LocalTimeZone()) << ' '
          << static_cast<long>(syscall(SYS_gettid)) << ' ' << Basename(file) << ':' << line
          << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string text = stream_.str();
  // One write keeps concurrent lines whole; a short write on stderr is not
  // worth retrying.
  [[maybe_unused]] ssize_t written = write(STDERR_FILENO, text.data(), text.size());
  if (severity_ == Severity::kFatal) std::abort();
}

}  // namespace internal
}  // namespace trident::log
