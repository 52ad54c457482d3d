#ifndef TRIDENT_TOOLS_CLI_CLUSTER_H_
#define TRIDENT_TOOLS_CLI_CLUSTER_H_

// A whole Trident cluster on this machine: the controller, an attention
// service, workers and the router, each its own process on loopback, plus a
// real Prometheus server scraping every /metrics. `trident up` and `down` are
// thin wrappers around these functions (`status`: cluster_status.h).
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
  // The model every worker and the router serve (the router reads only its
  // config and tokenizer). Empty: a random-weight llama3-tiny model,
  // generated once into <state_dir>/models/llama3-tiny.
  std::string model_dir;
  // One worker is started per entry: "prefill", "decode" or "both" (which
  // serves either half of a request, or both halves). At least one worker
  // must be able to prefill (prefill or both) and one to decode (decode or
  // both). Every worker sits behind the router, KV moving over UCX.
  std::vector<std::string> worker_roles = {"prefill", "decode"};
  // TLS on every gRPC port and mTLS between the services, with a private CA
  // made for the cluster under <state_dir>/tls (tools/tls/make_certs.sh).
  bool tls = false;
  // Extra flags passed to every worker after the cluster's own (e.g.
  // --dtype=bf16); a flag given twice takes the later value. --role,
  // --worker_id and --model are the cluster's to set.
  std::vector<std::string> worker_flags;
  // Decode-capable workers offload to the cluster's attention service every
  // sequence whose context reaches this many tokens (--offload_min_context_
  // tokens); 0: offload only for lack of KV blocks, where the cost tables
  // say it keeps the decode step's throughput.
  int32_t offload_min_context_tokens = 0;
  // The attention service's kernel threads (--threads) and KV budget.
  int32_t attention_threads = 1;
  int64_t attention_kv_budget_mb = 256;
  // MiB of that budget the attention service's KV block store may hold
  // (--kv_store_mb): the DRAM tier of the prefix cache, which the workers
  // given the service (the decode-capable ones) write their cached blocks
  // through to and fetch prompts' blocks from. A quarter of the default
  // budget; 0 turns the store off. At most attention_kv_budget_mb.
  int64_t attention_kv_store_mb = 64;
  // How often Prometheus scrapes each service.
  absl::Duration scrape_interval = absl::Seconds(1);
  // How long each process may take to become ready.
  absl::Duration ready_timeout = absl::Seconds(120);
  // Passed to every service as --drain_timeout.
  absl::Duration drain_timeout = absl::Seconds(3);
  // Extra flags for the controller (e.g. its policy's --decision_interval),
  // after the cluster's own.
  std::vector<std::string> controller_flags;
};

// One process of the cluster.
struct ProcessRecord {
  std::string name;       // Unique, e.g. "worker-0".
  std::string component;  // "router", "worker", "attention", "controller", "prometheus".
  pid_t pid = -1;
  int grpc_port = 0;     // 0 for Prometheus.
  int metrics_port = 0;  // Prometheus: its HTTP port.
  std::string log_path;
  // Workers: the role started with ("prefill", "decode" or "both"; the
  // controller may change it later); empty for other components. A worker's
  // id (its load reports, GenerateComplete.placement) is its name.
  std::string role;
  // The command line it was started with (RestartProcess runs it again).
  std::vector<std::string> argv;

  std::string GrpcAddress(const std::string& host) const;
};

struct ClusterState {
  std::string host;
  // Certificates of a cluster started with TLS (ClusterOptions::tls);
  // empty: plaintext.
  std::string tls_dir;
  // In start order; Prometheus last.
  std::vector<ProcessRecord> processes;

  const ProcessRecord* Find(const std::string& name) const;
  std::string PrometheusUrl() const;
  // host:port of the router's Generation API; empty without a router.
  std::string RouterAddress() const;
};

// Whether `roles` (ClusterOptions::worker_roles) names only known roles and
// can serve: kInvalidArgument, naming what is wrong, otherwise.
absl::Status ValidateWorkerRoles(const std::vector<std::string>& roles);

// The router's --prefill_workers and --decode_workers: the addresses of the
// workers started in a role that can prefill (prefill, both) and of those
// that can decode (decode, both), in start order. A `both` worker is in both
// lists; the router may then pick it for both halves of a request.
struct RouterWorkers {
  std::vector<std::string> prefill;
  std::vector<std::string> decode;
};
RouterWorkers RouterWorkersOf(const ClusterState& state);

// Whether a router's /metrics text shows a load report from each of
// `worker_ids` (a trident_router_worker_running_sequences series labelled
// with the id): the router then knows every worker it may route to.
bool RouterHasLoadOf(const std::string& metrics_text, const std::vector<std::string>& worker_ids);

// Starts the cluster (controller, attention service, workers, then the
// router with the workers' addresses, then Prometheus) and returns once every
// service reports SERVING through grpc.health.v1, the router has a load
// report from every worker and Prometheus is ready. On failure, whatever was
// started is stopped again and the error names the process and quotes its
// log. kFailedPrecondition if a cluster is already running in `state_dir`;
// kInvalidArgument for roles ValidateWorkerRoles refuses.
absl::StatusOr<ClusterState> Up(const ClusterOptions& options);

// Reads `<state_dir>/cluster.json`. kNotFound if no cluster was started there.
// Makes this process's channels to the cluster use the certificates in
// `tls_dir` (a ClusterState's); nothing when empty.
absl::Status UseClusterTls(const std::string& tls_dir);

absl::StatusOr<ClusterState> LoadState(const std::string& state_dir);

// Starts the process `name` of the cluster in `state_dir` again with the
// command line it was started with, once its old process has exited
// (SIGKILLed if still running), and records the new pid. The controller
// keeps its address (it is started on a fixed port, so that members and
// routers find it again); a process started on port 0 gets new ports.
// kNotFound for an unknown name.
absl::StatusOr<ProcessRecord> RestartProcess(const std::string& state_dir, const std::string& name,
                                             absl::Duration ready_timeout = absl::Seconds(60));

// Sends SIGTERM to every process in reverse start order (Prometheus, the
// router, the workers, ...), waits up to `timeout` for each and SIGKILLs
// those still running, then removes the state file. kNotFound if no cluster was started in
// `state_dir`.
absl::Status Down(const std::string& state_dir, absl::Duration timeout = absl::Seconds(10));

// The Prometheus scrape configuration for `state`'s services.
std::string PrometheusConfig(const ClusterState& state, absl::Duration scrape_interval);

}  // namespace trident::cli

#endif  // TRIDENT_TOOLS_CLI_CLUSTER_H_
