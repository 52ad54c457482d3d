#include "common/process/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace trident {
namespace {

// Closes a file descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

int RemainingMillis(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
}

std::string LogHint(const std::string& log_path) {
  if (log_path.empty()) return "";
  return absl::StrCat("; its log (", log_path, ") ends with:\n", TailOfFile(log_path));
}

// Runs in the child between fork and exec: only async-signal-safe calls.
[[noreturn]] void ExecChild(const SpawnOptions& options, char* const* argv, int log_fd,
                            int ready_write_fd) {
  sigset_t all;
  sigemptyset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);  // The launcher may block signals; children must not.
  if (options.new_session) setsid();
  if (log_fd >= 0) {
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
  }
  if (ready_write_fd >= 0) {
    // The pipe was created close-on-exec; keep only the write end open.
    fcntl(ready_write_fd, F_SETFD, 0);
  }
  execv(argv[0], argv);
  const char message[] = "exec failed\n";
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, message, sizeof(message) - 1);
  _exit(127);
}

}  // namespace

absl::StatusOr<SpawnedProcess> Spawn(const SpawnOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("argv is empty");
  const std::string& program = options.argv[0];
  if (access(program.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(program, " is not an executable file"));
  }

  int pipe_fds[2] = {-1, -1};
  if (options.wait_for_ready_line && pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  Fd ready_read(pipe_fds[0]);
  Fd ready_write(pipe_fds[1]);

  Fd log_fd(options.log_path.empty()
                ? -1
                : open(options.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!options.log_path.empty()) {
    if (log_fd.get() < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot open log file ", options.log_path, ": ", std::strerror(errno)));
    }
  }

  std::vector<std::string> args = options.argv;
  if (options.wait_for_ready_line) args.push_back(absl::StrCat("--ready_fd=", ready_write.get()));
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  const pid_t pid = fork();
  if (pid < 0) return absl::ResourceExhaustedError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) ExecChild(options, argv.data(), log_fd.get(), ready_write.get());

  SpawnedProcess spawned;
  spawned.pid = pid;
  if (!options.wait_for_ready_line) return spawned;
  ready_write.Reset();  // Only the child holds the write end now: EOF means it is gone.

  const absl::Time deadline = absl::Now() + options.ready_timeout;
  std::string buffer;
  while (buffer.find('\n') == std::string::npos) {
    pollfd fds[1] = {{ready_read.get(), POLLIN, 0}};
    const int ready = poll(fds, 1, RemainingMillis(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return absl::DeadlineExceededError(
          absl::StrCat(program, " did not report ready within ",
                       absl::FormatDuration(options.ready_timeout), LogHint(options.log_path)));
    }
    char chunk[512];
    const ssize_t n = read(ready_read.get(), chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // The child closed the pipe without a line: it exited (or is exiting).
      int wait_status = 0;
      waitpid(pid, &wait_status, 0);
      const std::string how =
          WIFEXITED(wait_status)
              ? absl::StrCat("exited with code ", WEXITSTATUS(wait_status))
              : absl::StrCat("was killed by signal ", WTERMSIG(wait_status));
      return absl::FailedPreconditionError(
          absl::StrCat(program, " ", how, " before it was ready", LogHint(options.log_path)));
    }
    buffer.append(chunk, static_cast<size_t>(n));
  }
  spawned.ready_line = buffer.substr(0, buffer.find('\n'));
  return spawned;
}

absl::StatusOr<ExitInfo> WaitForExit(pid_t pid, absl::Duration timeout) {
  // A child's exit status can be collected; try that first.
  int wait_status = 0;
  const pid_t reaped = waitpid(pid, &wait_status, WNOHANG);
  bool is_child = reaped >= 0 || errno != ECHILD;
  auto exit_info = [](int status) {
    ExitInfo info;
    if (WIFEXITED(status)) info.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) info.signal = WTERMSIG(status);
    return info;
  };
  if (reaped == pid) return exit_info(wait_status);

  Fd pidfd(PidfdOpen(pid));
  if (pidfd.get() < 0) {
    if (errno == ESRCH) return absl::NotFoundError(absl::StrCat("no process ", pid));
    return absl::InternalError(absl::StrCat("pidfd_open(", pid, "): ", std::strerror(errno)));
  }
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    pollfd fds[1] = {{pidfd.get(), POLLIN, 0}};
    const int ready = poll(fds, 1, RemainingMillis(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("process ", pid, " still running after ", absl::FormatDuration(timeout)));
    }
    break;
  }
  if (is_child && waitpid(pid, &wait_status, 0) == pid) return exit_info(wait_status);
  return ExitInfo{};
}

bool IsRunning(pid_t pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  // A zombie still answers kill(0); its state letter in /proc says so.
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = content.rfind(')');
  return paren == std::string::npos || paren + 2 >= content.size() || content[paren + 2] != 'Z';
}

std::string TailOfFile(const std::string& path, size_t max_bytes) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return "";
  std::stringstream content;
  content << file.rdbuf();
  std::string text = content.str();
  if (text.size() > max_bytes) text = text.substr(text.size() - max_bytes);
  return text;
}

}  // namespace trident
