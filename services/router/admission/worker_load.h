#ifndef TRIDENT_SERVICES_ROUTER_ADMISSION_WORKER_LOAD_H_
#define TRIDENT_SERVICES_ROUTER_ADMISSION_WORKER_LOAD_H_

// The part of a worker's load report (trident.v1.WorkerLoad) that admission
// reads, as a plain struct: worker_load_proto.h converts and validates the
// proto; tests and simulations build it directly.

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trident::router::admission {

// What a worker does (trident.v1.Role without UNSPECIFIED).
enum class WorkerRole { kPrefill, kDecode, kBoth };

absl::string_view WorkerRoleName(WorkerRole role);

// One load sample of one worker. Value type.
struct WorkerLoadReport {
  // Id of the worker; not empty.
  std::string worker_id;
  // Incarnation of the worker process.
  uint64_t incarnation = 0;
  WorkerRole role = WorkerRole::kBoth;
  // False while the worker drains (role flip or shutdown) or is dead: it then
  // takes no new requests.
  bool accepting = true;
  // Sequences in the running decode batch.
  int32_t running_sequences = 0;
  // Prompts waiting for prefill (prefill role) or sequences waiting for
  // blocks or a batch slot (decode role).
  int32_t waiting_sequences = 0;
  // Prompt tokens queued for prefill and not yet computed.
  int64_t queued_prefill_tokens = 0;
  // Sum of the context lengths of the running decode batch.
  int64_t batch_context_tokens = 0;
  // KV blocks free, and the pool's size.
  int32_t kv_blocks_free = 0;
  int32_t kv_blocks_total = 0;
  // Measured prefill throughput; 0 when the worker did no prefill recently.
  double prefill_tokens_per_second = 0;
  // Measured duration of one decode step at about `running_sequences` and
  // `batch_context_tokens`; zero when not decoding.
  absl::Duration decode_step_time = absl::ZeroDuration();
  // The worker has no KV transport: it is paired with itself alone (both
  // halves of a request on it, role both).
  bool colocated_only = false;
};

}  // namespace trident::router::admission

#endif  // TRIDENT_SERVICES_ROUTER_ADMISSION_WORKER_LOAD_H_
