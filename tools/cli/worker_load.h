// `trident status`'s view of one worker: its live role, its queues and its
// KV cache, read from the first sample of its WorkerControl.GetLoad stream
// (proto/trident/v1/worker.proto), and its prefix cache (GetKvStats). The
// load stream rather than /metrics: one typed message carries every figure,
// including a role the controller changed at run time and a role change in
// progress.

#ifndef TRIDENT_TOOLS_CLI_WORKER_LOAD_H_
#define TRIDENT_TOOLS_CLI_WORKER_LOAD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trident/v1/cluster.pb.h"
#include "trident/v1/worker.pb.h"

namespace trident::cli {

struct WorkerLoadSummary {
  std::string worker_id;
  // "prefill", "decode" or "both".
  std::string role;
  // While draining for a role change, the role being switched to; else empty.
  std::string pending_role;
  // "serving" or "draining".
  std::string state;
  int32_t running_sequences = 0;
  int32_t waiting_sequences = 0;
  // Running sequences whose decode attention runs on a CPU attention
  // service.
  int32_t cpu_attention_sequences = 0;
  // KV blocks in use (sequences and reservations) over the pool's size; 0
  // for an empty pool.
  double kv_cache_usage_ratio = 0;
};

WorkerLoadSummary SummarizeWorkerLoad(const trident::v1::WorkerLoad& load);

// Opens a GetLoad stream to `address` (host:port), reads its first sample
// (sent at once) and cancels the stream. The RPC's error if the worker does
// not answer within `timeout` (DEADLINE_EXCEEDED) or refuses the call;
// UNAVAILABLE if the stream ends without a sample. Blocks; thread-safe.
absl::StatusOr<WorkerLoadSummary> ReadWorkerLoad(const std::string& address,
                                                 absl::Duration timeout = absl::Seconds(2));

// WorkerControl.GetKvStats of the worker at `address`: its KV pool and
// prefix cache (blocks cached, prompt tokens looked up and found since it
// started). The RPC's error if the worker does not answer within `timeout`
// or refuses the call (FAILED_PRECONDITION without a model). Blocks;
// thread-safe.
absl::StatusOr<trident::v1::KvStats> ReadWorkerKvStats(const std::string& address,
                                                       absl::Duration timeout = absl::Seconds(2));

}  // namespace trident::cli

#endif  // TRIDENT_TOOLS_CLI_WORKER_LOAD_H_
