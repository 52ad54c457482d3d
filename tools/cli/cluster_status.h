// `trident status`: every process of a local cluster (cluster.h), whether it
// runs and serves, for each worker its live role, sequences, KV cache and
// prefix cache, and for each attention service its KV and block store.

#ifndef TRIDENT_TOOLS_CLI_CLUSTER_STATUS_H_
#define TRIDENT_TOOLS_CLI_CLUSTER_STATUS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tools/cli/cluster.h"
#include "tools/cli/worker_load.h"
#include "trident/v1/attention.pb.h"
#include "trident/v1/controller.pb.h"

namespace trident::cli {

// One process's status.
struct ProcessStatus {
  ProcessRecord record;
  bool running = false;
  // "SERVING", "NOT_SERVING", ..., or the error that the health check got.
  std::string health;
  // Workers: the first sample of the load stream (worker_load.h), or why it
  // could not be read in `load_error`.
  std::optional<WorkerLoadSummary> load;
  std::string load_error;
  // Workers: their KV pool and prefix cache (WorkerControl.GetKvStats);
  // unset when it could not be read.
  std::optional<trident::v1::KvStats> kv_stats;
  // Attention services: their GetStats, or why it could not be read.
  std::optional<trident::v1::AttentionStats> attention;
  // The controller: its status (GetStatus) and topology, or why they could
  // not be read.
  std::optional<trident::v1::ControllerStatus> controller;
  std::optional<trident::v1::Topology> topology;
  std::string controller_error;
};

// What the controller at `address` says: GetStatus (its newest
// `max_decisions` decisions) and GetTopology, each within `timeout`. The
// first call's error, its code kept and its message naming the call.
struct ControllerView {
  trident::v1::ControllerStatus status;
  trident::v1::Topology topology;
};
absl::StatusOr<ControllerView> ReadController(const std::string& address, int32_t max_decisions,
                                              absl::Duration timeout = absl::Seconds(2));

// Checks every process: alive, its health (Prometheus: /-/ready) and, for a
// running worker, its load and KV stats. Blocks for up to a few seconds per
// process that does not answer.
std::vector<ProcessStatus> CheckStatus(const ClusterState& state);

// Whether every process is running and SERVING (Prometheus: ready).
bool AllServing(const std::vector<ProcessStatus>& statuses);

// The tables `trident status` prints: one line per process (name, pid,
// addresses, health), then one per worker (role, with a role change in
// progress as "old->new", state, running and waiting sequences, KV cache
// usage, sequences whose attention runs on a CPU attention service, the
// prefix cache's hit rate since the worker started (prompt tokens found
// cached over those looked up, blocks the DRAM tier fetched for a request
// included: they reach the pool before the request does) and its cached
// blocks, "-" for either when unknown or before any lookup), then one per
// attention service (NUMA node, ISA and threads, sequences, tokens and KV
// memory held of its budget, sessions, requests served), then each one's
// block store (blocks, MiB held of its budget, blocks its lookups matched of
// lookups; "off" without a budget). A worker whose load could not be read
// shows its start role and the error. Last, the controller: its members as
// it sees them (role, state), each role's pressure and forecast, and its
// last decision with the reason.
std::string FormatStatus(const ClusterState& state, const std::vector<ProcessStatus>& statuses);

}  // namespace trident::cli

#endif  // TRIDENT_TOOLS_CLI_CLUSTER_STATUS_H_
