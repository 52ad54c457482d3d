// How the router runs requests on its workers (RemoteTokenSource and its
// flights): deadlines, KV waits, migration and the progress watchdog.

#ifndef TRIDENT_SERVICES_ROUTER_ROUTING_OPTIONS_H_
#define TRIDENT_SERVICES_ROUTER_ROUTING_OPTIONS_H_

#include "absl/time/time.h"
#include "common/time/clock.h"
#include "services/router/kv_index/kv_index.h"
#include "services/router/router_metrics.h"

namespace trident::router {

struct RemoteTokenSourceOptions {
  // Lease asked for each KV reservation.
  absl::Duration reserve_lease = absl::Seconds(30);
  // Whether decode workers may place a request's KV on a CPU attention
  // service (ReserveKvRequest.allow_cpu_attention): its long-context
  // requests, or any when their GPU pool is full.
  bool allow_cpu_attention = true;
  // Deadline of each worker call (the whole prefill, the whole decode).
  absl::Duration call_timeout = absl::Minutes(10);
  // Deadline of one ReserveKv call.
  absl::Duration reserve_timeout = absl::Seconds(10);
  // A request that finds the decode side's KV cache full waits for room at
  // most until its TTFT target (admission on), its deadline, or this long
  // after its arrival, whichever comes first.
  absl::Duration max_kv_wait = absl::Seconds(60);
  // How often a waiting request asks again when nothing wakes it sooner.
  absl::Duration kv_retry_interval = absl::Milliseconds(100);
  // The RetryInfo delay of a request that waited in vain.
  absl::Duration kv_full_retry_after = absl::Seconds(1);
  // Migration: how many times one request may move to another worker pair
  // after a worker failed under it (its stream broke, it was unreachable,
  // it answered UNAVAILABLE or ABORTED, or it stalled). The request resumes
  // with its prompt plus the tokens already streamed; the client's stream
  // goes on. 0: a failed worker fails its requests.
  int migration_limit = 3;
  // How long a migrating request waits for a worker to take it (none is
  // eligible, or the chosen one's KV cache is full) before it ends
  // UNAVAILABLE.
  absl::Duration migration_wait = absl::Seconds(10);
  // A decode stream that brings no token for this long after the request's
  // first token is stalled: the router ends it and migrates the request.
  // Zero or infinite: no watchdog.
  absl::Duration stall_timeout = absl::Seconds(10);
  // HTTP/2 keepalive on every channel to a worker: a ping after this long
  // without one, and the connection is dropped (its calls fail UNAVAILABLE,
  // and migrate) when no answer comes within keepalive_timeout. A stopped
  // or hung worker is noticed this way; a killed one at once.
  absl::Duration keepalive_interval = absl::Seconds(2);
  absl::Duration keepalive_timeout = absl::Seconds(2);
  // Where request outcomes, admission decisions and latencies are recorded
  // (router_metrics.h); null: nowhere. Must outlive the source.
  RouterMetrics* metrics = nullptr;
  // The workers' prefix caches, for KV-aware routing (each prefill worker
  // priced for the prompt tokens it lacks); null: every prompt priced
  // whole. Must outlive the source.
  const kv_index::KvIndex* kv_index = nullptr;
  // The clock latencies and waits are measured on; null: the real clock.
  const Clock* clock = nullptr;
  // Whether a thread of the source retries and expires waiting requests
  // and runs the watchdog on its own. false: only RunTimersForTesting does
  // (tests on a fake clock).
  bool timer_thread = true;
};

}  // namespace trident::router

#endif  // TRIDENT_SERVICES_ROUTER_ROUTING_OPTIONS_H_
