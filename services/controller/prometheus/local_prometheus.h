#ifndef TRIDENT_SERVICES_CONTROLLER_PROMETHEUS_LOCAL_PROMETHEUS_H_
#define TRIDENT_SERVICES_CONTROLLER_PROMETHEUS_LOCAL_PROMETHEUS_H_

// A real Prometheus server (Debian's `prometheus`) for tests: started on
// 127.0.0.1 port 0 with a scrape config for the given targets, its data and
// config under a directory the test owns, stopped with the object.
//
// It waits without sleeping: the server's log goes through a pipe that a
// thread reads line by line (and copies to `<dir>/prometheus.log`), and
// Start() waits on those lines for the port the server bound ("Listening
// on" address=127.0.0.1:N) and for "Server is ready to receive web
// requests.".

#include <sys/types.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace trident::controller {

struct LocalPrometheusOptions {
  // The server binary: a path, or a name looked up in PATH.
  std::string binary = "prometheus";
  // Directory for its config, data and log; created if absent. Each server
  // needs its own.
  std::string dir;
  // host:port of each target, all in one job named `job`.
  std::vector<std::string> targets;
  std::string job = "test";
  absl::Duration scrape_interval = absl::Milliseconds(200);
  // How long Start() waits for the server to be ready.
  absl::Duration ready_timeout = absl::Seconds(60);
};

// Thread-compatible.
class LocalPrometheus {
 public:
  // Starts the server and returns once it serves its API. kNotFound if the
  // binary is missing; kFailedPrecondition (with the log's end) if it exits
  // during start-up; kDeadlineExceeded if it is not ready in time (it is
  // then killed).
  static absl::StatusOr<std::unique_ptr<LocalPrometheus>> Start(LocalPrometheusOptions options);

  // Stops the server (SIGTERM, then SIGKILL after 10 s) if it still runs.
  ~LocalPrometheus();

  LocalPrometheus(const LocalPrometheus&) = delete;
  LocalPrometheus& operator=(const LocalPrometheus&) = delete;

  // "http://127.0.0.1:<port>".
  std::string url() const;

  // Stops the server now and waits for it to exit. Idempotent.
  absl::Status Stop();

  // The log so far.
  std::string log() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  LocalPrometheus(pid_t pid, int log_fd, const std::string& log_path);

  // Waits until a log line contains `text` (true), or the server's log ends
  // (it exited) or `deadline` passes (false).
  bool WaitForLine(const std::string& text, absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // Reads the server's log until it closes.
  void ReadLog(int fd, std::string log_path);

  pid_t pid_;
  int port_ = 0;
  mutable absl::Mutex mu_;
  std::string log_ ABSL_GUARDED_BY(mu_);
  bool log_closed_ ABSL_GUARDED_BY(mu_) = false;
  std::thread reader_;
};

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_PROMETHEUS_LOCAL_PROMETHEUS_H_
