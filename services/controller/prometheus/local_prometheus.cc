#include "services/controller/prometheus/local_prometheus.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/process/subprocess.h"

extern char** environ;

namespace trident::controller {
namespace {

constexpr char kListeningLine[] = "msg=\"Listening on\" address=";
constexpr char kReadyLine[] = "Server is ready to receive web requests.";

absl::StatusOr<std::string> FindBinary(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (access(name.c_str(), X_OK) == 0) return name;
    return absl::NotFoundError(absl::StrCat(name, " is not an executable file"));
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path == nullptr ? "/usr/bin:/bin" : path, ':')) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(
      absl::StrCat("cannot find '", name, "' in PATH; install Debian's prometheus package"));
}

std::string ScrapeConfig(const LocalPrometheusOptions& options) {
  const std::string interval =
      absl::StrCat(absl::ToInt64Milliseconds(options.scrape_interval), "ms");
  std::string config =
      absl::StrCat("global:\n  scrape_interval: ", interval, "\n  evaluation_interval: ", interval,
                   "\nscrape_configs:\n  - job_name: ", options.job,
                   "\n    static_configs:\n      - targets: [");
  for (size_t i = 0; i < options.targets.size(); ++i) {
    absl::StrAppend(&config, i == 0 ? "" : ", ", "'", options.targets[i], "'");
  }
  absl::StrAppend(&config, "]\n");
  return config;
}

// Starts `argv` with stdout and stderr into the write end of a new pipe;
// returns the child's pid and the read end.
absl::StatusOr<std::pair<pid_t, int>> SpawnWithLogPipe(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int error = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (error != 0) {
    close(fds[0]);
    return absl::InternalError(absl::StrCat("posix_spawn ", argv[0], ": ", std::strerror(error)));
  }
  return std::make_pair(pid, fds[0]);
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalPrometheus>> LocalPrometheus::Start(
    LocalPrometheusOptions options) {
  absl::StatusOr<std::string> binary = FindBinary(options.binary);
  if (!binary.ok()) return binary.status();
  std::error_code error;
  std::filesystem::create_directories(options.dir + "/data", error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", options.dir, "/data: ", error.message()));
  }
  const std::string config_path = options.dir + "/prometheus.yml";
  {
    std::ofstream config(config_path);
    config << ScrapeConfig(options);
    if (!config) return absl::InternalError(absl::StrCat("cannot write ", config_path));
  }
  absl::StatusOr<std::pair<pid_t, int>> spawned =
      SpawnWithLogPipe({*binary, absl::StrCat("--config.file=", config_path),
                        absl::StrCat("--storage.tsdb.path=", options.dir, "/data"),
                        "--web.listen-address=127.0.0.1:0", "--log.level=info"});
  if (!spawned.ok()) return spawned.status();
  std::unique_ptr<LocalPrometheus> server(
      new LocalPrometheus(spawned->first, spawned->second, options.dir + "/prometheus.log"));

  const absl::Time deadline = absl::Now() + options.ready_timeout;
  const bool listening = server->WaitForLine(kListeningLine, deadline);
  const bool ready = listening && server->WaitForLine(kReadyLine, deadline);
  if (ready) {
    // ... msg="Listening on" address=127.0.0.1:38185
    const std::string log = server->log();
    const size_t at = log.find(kListeningLine) + std::strlen(kListeningLine);
    const std::string address = log.substr(at, log.find_first_of(" \n", at) - at);
    const size_t colon = address.rfind(':');
    if (colon != std::string::npos && absl::SimpleAtoi(address.substr(colon + 1), &server->port_) &&
        server->port_ > 0) {
      return server;
    }
  }
  const bool running = IsRunning(server->pid_);
  (void)server->Stop();
  const std::string what =
      !running ? "exited during start-up"
               : (ready ? "reported no port it listens on"
                        : absl::StrCat("was not ready within ",
                                       absl::FormatDuration(options.ready_timeout)));
  const std::string message = absl::StrCat("prometheus ", what, "; its log ends with:\n",
                                           TailOfFile(options.dir + "/prometheus.log"));
  return running ? absl::DeadlineExceededError(message) : absl::FailedPreconditionError(message);
}

LocalPrometheus::LocalPrometheus(pid_t pid, int log_fd, const std::string& log_path)
    : pid_(pid), reader_([this, log_fd, log_path] { ReadLog(log_fd, log_path); }) {}

LocalPrometheus::~LocalPrometheus() { (void)Stop(); }

std::string LocalPrometheus::url() const { return absl::StrCat("http://127.0.0.1:", port_); }

absl::Status LocalPrometheus::Stop() {
  absl::Status status;
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    if (!WaitForExit(pid_, absl::Seconds(10)).ok()) {
      kill(pid_, SIGKILL);
      status = WaitForExit(pid_, absl::Seconds(10)).status();
    }
    pid_ = -1;
  }
  // The pipe closes when the server exits, which ends the reader.
  if (reader_.joinable()) reader_.join();
  return status;
}

std::string LocalPrometheus::log() const {
  absl::MutexLock lock(&mu_);
  return log_;
}

bool LocalPrometheus::WaitForLine(const std::string& text, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto seen_or_closed = [this, &text]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return log_closed_ || log_.find(text) != std::string::npos;
  };
  mu_.AwaitWithDeadline(absl::Condition(&seen_or_closed), deadline);
  return log_.find(text) != std::string::npos;
}

void LocalPrometheus::ReadLog(int fd, std::string log_path) {
  std::ofstream file(log_path, std::ios::app);
  char buffer[4096];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    file.write(buffer, n);
    file.flush();
    absl::MutexLock lock(&mu_);
    log_.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  absl::MutexLock lock(&mu_);
  log_closed_ = true;
}

}  // namespace trident::controller
