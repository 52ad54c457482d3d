#ifndef TRIDENT_COMMON_PROCESS_SUBPROCESS_H_
#define TRIDENT_COMMON_PROCESS_SUBPROCESS_H_

// Starting service processes and waiting for them, without sleeping: a
// service reports readiness by writing one line to a pipe (its `--ready_fd`),
// and exits are observed through a pidfd, which also works for processes that
// are not our children (`trident down` stopping a cluster `trident up`
// started).

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trident {

struct SpawnOptions {
  // Program and arguments; argv[0] is the path executed.
  std::vector<std::string> argv;
  // File that receives the process's stdout and stderr (appended). Empty:
  // inherit ours.
  std::string log_path;
  // Start the process in a session of its own, so it outlives the launcher
  // and a terminal's Ctrl-C does not reach it.
  bool new_session = false;
  // Append `--ready_fd=N` to argv and wait for the line written to it (see
  // SpawnedProcess::ready_line).
  bool wait_for_ready_line = false;
  // How long to wait for the ready line.
  absl::Duration ready_timeout = absl::Seconds(60);
};

struct SpawnedProcess {
  pid_t pid = -1;
  // The line the process wrote to its --ready_fd, without the newline.
  std::string ready_line;
};

// Starts a process. With `wait_for_ready_line`, returns once the line
// arrived; if the process exits first, or the timeout passes, it is killed
// and kFailedPrecondition / kDeadlineExceeded is returned with the end of its
// log. kNotFound if argv[0] is not an executable.
absl::StatusOr<SpawnedProcess> Spawn(const SpawnOptions& options);

// How a process ended.
struct ExitInfo {
  // Exit code if it exited; -1 if it was killed by a signal.
  int exit_code = -1;
  // Signal number if it was killed by one; 0 otherwise.
  int signal = 0;
};

// Waits until `pid` exits, at most `timeout`. For a child of this process the
// exit status is collected (and the zombie reaped); for any other process
// only the fact that it ended is known (exit_code -1, signal 0). Returns
// kDeadlineExceeded if it is still running at the timeout, kNotFound if no
// such process exists.
absl::StatusOr<ExitInfo> WaitForExit(pid_t pid, absl::Duration timeout);

// Whether a process with this pid exists (and is not a zombie).
bool IsRunning(pid_t pid);

// The last `max_bytes` bytes of a file, for error messages; empty if unreadable.
std::string TailOfFile(const std::string& path, size_t max_bytes = 2000);

}  // namespace trident

#endif  // TRIDENT_COMMON_PROCESS_SUBPROCESS_H_
