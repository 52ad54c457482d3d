#ifndef TRIDENT_COMMON_LOGGING_LOG_H_
#define TRIDENT_COMMON_LOGGING_LOG_H_

// Trident's one logging facade. Lines go to stderr, one write(2) per line so
// lines from concurrent threads never interleave:
//
//   I20261121 14:03:07.123456 4711 router.cc:42] listening on 127.0.0.1:50051
//
//   TRIDENT_LOG(INFO) << "listening on " << address;
//   TRIDENT_CHECK(block < num_blocks) << "block " << block << " out of range";
//   TRIDENT_CHECK_OK(status);  // Aborts with the status if it is not OK.
//
// FATAL and a failed CHECK log the line and abort. CHECK is for impossible
// states (bugs) only; anything that input, load or the environment can cause
// returns absl::Status instead. The minimum severity printed comes from
// `--log_level` (debug, info, warning, error) once `InitLoggingFromFlags()`
// has run. Thread-safe.

#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trident::log {

enum class Severity : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

// Sets the least severe level that is printed. FATAL always prints.
void SetMinSeverity(Severity severity);
Severity MinSeverity();

// Applies `--log_level`. Call once after absl::ParseCommandLine.
void InitLoggingFromFlags();

// Parses "debug", "info", "warning", "error" (any case).
bool ParseSeverity(absl::string_view text, Severity* severity);

namespace internal {

inline constexpr Severity DEBUG = Severity::kDebug;
inline constexpr Severity INFO = Severity::kInfo;
inline constexpr Severity WARNING = Severity::kWarning;
inline constexpr Severity ERROR = Severity::kError;
inline constexpr Severity FATAL = Severity::kFatal;

// One log line being built. Writes (and for FATAL aborts) in its destructor.
class LogMessage {
 public:
  LogMessage(const char* file, int line, Severity severity);
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  ~LogMessage();

  std::ostream& stream() { return stream_; }

 private:
  Severity severity_;
  std::ostringstream stream_;
};

// Swallows a stream expression in the disabled branch of the macros below.
struct Voidify {
  void operator&(std::ostream&) {}
};

}  // namespace internal
}  // namespace trident::log

#define TRIDENT_LOG_IS_ON(severity) \
  (::trident::log::internal::severity >= ::trident::log::MinSeverity())

#define TRIDENT_LOG(severity)                                                    \
  !TRIDENT_LOG_IS_ON(severity)                                                   \
      ? (void)0                                                                  \
      : ::trident::log::internal::Voidify() &                                    \
            ::trident::log::internal::LogMessage(__FILE__, __LINE__,             \
                                                 ::trident::log::internal::severity) \
                .stream()

#define TRIDENT_CHECK(condition)                                                           \
  (condition) ? (void)0                                                                    \
              : ::trident::log::internal::Voidify() &                                      \
                    ::trident::log::internal::LogMessage(__FILE__, __LINE__,               \
                                                         ::trident::log::Severity::kFatal) \
                            .stream()                                                      \
                        << "Check failed: " #condition " "

#define TRIDENT_CHECK_OK(expr)                                                          \
  do {                                                                                  \
    const ::absl::Status trident_check_ok_status_ = (expr);                             \
    TRIDENT_CHECK(trident_check_ok_status_.ok()) << #expr << ": " << trident_check_ok_status_; \
  } while (false)

#endif  // TRIDENT_COMMON_LOGGING_LOG_H_
