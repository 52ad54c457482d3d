// Overload through real processes, shared by //tests:overload_test (which
// asserts behaviour with margins that hold on a loaded machine) and
// bench/overload.sh (which reports the precise figures): 2 prefill + 2
// decode CPU workers behind a router, driven open loop by the load
// generator at twice the cluster's measured capacity.
//
// Phases (each needs the one before):
//   1. Unloaded latencies: 16 requests at 2/s (which also warm the workers
//      up); their TTFT and TPOT medians times the SLO factors are the SLO
//      targets. The factors leave room for the batching and queueing a
//      loaded cluster needs to be useful at all (4 CPU workers share the
//      machine's cores: a busy prefill slows every decode step).
//   2. Capacity: a burst of requests without targets, all sent at once; the
//      cluster's saturated throughput is their number over the time from
//      the burst to the last completion.
//   3. Overload, admission on: Poisson arrivals at `overload_factor` times
//      the capacity, every request carrying the targets.
//   4. Overload, admission off: the router restarted with
//      --admission=false, the same workers, the same schedule (same seed).
// After each phase every worker's KV blocks must all be free again.

#ifndef TRIDENT_TESTS_TESTING_OVERLOAD_SCENARIO_H_
#define TRIDENT_TESTS_TESTING_OVERLOAD_SCENARIO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/loadgen/runner.h"

namespace trident::testing {

struct OverloadOptions {
  // The service binaries.
  std::string worker_bin;
  std::string router_bin;
  // Where the generated model goes, and the services' logs.
  std::string scratch_dir;
  std::string log_dir;
  uint64_t seed = 20240611;
  // SLO targets as multiples of the unloaded medians.
  double ttft_slo_factor = 10;
  double tpot_slo_factor = 8;
  // Overload: arrivals at this multiple of the measured capacity, for this
  // long.
  double overload_factor = 2;
  absl::Duration overload_duration = absl::Seconds(15);
  int burst_requests = 40;
};

// The send-to-rejection latency of a run's rejections.
struct RejectionLatency {
  int64_t count = 0;
  double p50_ms = 0;
  double p99_ms = 0;
};

struct OverloadResult {
  loadgen::RunResult unloaded;
  loadgen::RunResult burst;
  loadgen::RunResult admission_on;
  loadgen::RunResult admission_off;
  absl::Duration ttft_slo;
  absl::Duration tpot_slo;
  // Saturated throughput and the overload's arrival rate, requests/s.
  double capacity_rps = 0;
  double overload_rps = 0;
  RejectionLatency on_rejections;
  // Whether every worker's KV blocks were all free after every phase.
  bool kv_blocks_free_after_each_phase = true;
};

// Runs the four phases, printing each run's report and the admission's
// predictions against outcomes (from the router's debug log). Errors: a
// service that does not start, a phase whose requests do not all complete
// (unloaded, burst), a load run that fails.
absl::StatusOr<OverloadResult> RunOverloadScenario(const OverloadOptions& options);

// One paragraph with every figure of `result`, starting "SUMMARY".
std::string OverloadSummary(const OverloadOptions& options, const OverloadResult& result);

}  // namespace trident::testing

#endif  // TRIDENT_TESTS_TESTING_OVERLOAD_SCENARIO_H_
