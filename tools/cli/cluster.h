#ifndef TRIDENT_TOOLS_CLI_CLUSTER_H_
#define TRIDENT_TOOLS_CLI_CLUSTER_H_

// A whole Trident cluster on this machine: the controller, an attention
// service, workers and the router, each its own process on loopback, plus a
// real Prometheus server scraping every /metrics. `trident up`, `down` and
// `status` are thin wrappers around these functions.
//
// The cluster's state (pids, ports, logs) lives in `<state_dir>/cluster.json`;
// logs in `<state_dir>/logs/`, Prometheus's data in `<state_dir>/prometheus/`.

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace trident::cli {

struct ClusterOptions {
  // Where state, logs and Prometheus data go. Created if missing.
  std::string state_dir;
  // Directory holding the service binaries (router, worker, attention,
  // controller). Empty: found next to the `trident` binary (Bazel runfiles or
  // an installed bin/ directory).
  std::string bin_dir;
  // The Prometheus server binary; a bare name is looked up in PATH.
  std::string prometheus_bin = "prometheus";
  // Address every process binds.
  std::string host = "127.0.0.1";
  // One worker is started per entry: "prefill", "decode" or "both".
  std::vector<std::string> worker_roles = {"both"};
  // Extra flags passed to every worker (e.g. --model=...).
  std::vector<std::string> worker_flags;
  // How often Prometheus scrapes each service.
  absl::Duration scrape_interval = absl::Seconds(1);
  // How long each process may take to become ready.
  absl::Duration ready_timeout = absl::Seconds(120);
  // Passed to every service as --drain_timeout.
  absl::Duration drain_timeout = absl::Seconds(3);
};

// One process of the cluster.
struct ProcessRecord {
  std::string name;       // Unique, e.g. "worker-0".
  std::string component;  // "router", "worker", "attention", "controller", "prometheus".
  pid_t pid = -1;
  int grpc_port = 0;     // 0 for Prometheus.
  int metrics_port = 0;  // Prometheus: its HTTP port.
  std::string log_path;
  // Workers: "prefill", "decode" or "both"; empty for other components.
  std::string role;

  std::string GrpcAddress(const std::string& host) const;
};

struct ClusterState {
  std::string host;
  // In start order; Prometheus last.
  std::vector<ProcessRecord> processes;

  const ProcessRecord* Find(const std::string& name) const;
  std::string PrometheusUrl() const;
};

// Starts the cluster and returns once every service reports SERVING through
// grpc.health.v1 and Prometheus is ready. On failure, whatever was started is
// stopped again and the error names the process and quotes its log.
// kFailedPrecondition if a cluster is already running in `state_dir`.
absl::StatusOr<ClusterState> Up(const ClusterOptions& options);

// Reads `<state_dir>/cluster.json`. kNotFound if no cluster was started there.
absl::StatusOr<ClusterState> LoadState(const std::string& state_dir);

// Sends SIGTERM to every process (router first, Prometheus last), waits up to
// `timeout` for each and SIGKILLs those still running, then removes the state
// file. kNotFound if no cluster was started in `state_dir`.
absl::Status Down(const std::string& state_dir, absl::Duration timeout = absl::Seconds(10));

// One line a process for `trident status`.
struct ProcessStatus {
  ProcessRecord record;
  bool running = false;
  // "SERVING", "NOT_SERVING", ..., or the error that the health check got.
  std::string health;
};

// Checks every process: alive, and its health (Prometheus: /-/ready).
std::vector<ProcessStatus> CheckStatus(const ClusterState& state);

// Whether every process is running and SERVING (Prometheus: ready).
bool AllServing(const std::vector<ProcessStatus>& statuses);

// The Prometheus scrape configuration for `state`'s services.
std::string PrometheusConfig(const ClusterState& state, absl::Duration scrape_interval);

}  // namespace trident::cli

#endif  // TRIDENT_TOOLS_CLI_CLUSTER_H_
