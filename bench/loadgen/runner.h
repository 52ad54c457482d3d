#ifndef TRIDENT_BENCH_LOADGEN_RUNNER_H_
#define TRIDENT_BENCH_LOADGEN_RUNNER_H_

// Drives a trident.v1.Generation server (router, or a worker in role `both`)
// with the schedule of a WorkloadSpec, open loop: each request is started at
// its scheduled time through gRPC's callback API and never waits for earlier
// responses. Requests over `max_in_flight` are dropped at the client and
// counted, not delayed.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/workload.h"
#include "nlohmann/json.hpp"
#include "trident/v1/generation.pb.h"

namespace trident::loadgen {

struct RunOptions {
  // host:port of the Generation server.
  std::string target;
  // GenerateRequest.model; empty means the served model.
  std::string model;
  WorkloadSpec workload;
  // Requests in flight at most; more are dropped (open loop: never delayed).
  int64_t max_in_flight = 1000;
  // Deadline of each Generate call, from its send.
  absl::Duration request_timeout = absl::Minutes(10);
  // How long to wait for the server's ModelInfo before sending anything.
  absl::Duration connect_timeout = absl::Seconds(30);
  // gRPC channels (each its own TCP connection) the requests are spread
  // over round-robin, so that one HTTP/2 connection's stream limit never
  // queues requests at the client.
  int32_t num_channels = 4;
  // Print a progress line to stderr every second.
  bool print_progress = true;
};

// What a run produced.
struct RunResult {
  absl::Time start;                    // Schedule offsets count from here.
  std::vector<RequestRecord> records;  // One per scheduled request, by index.
  Report report;
  // ReportToJson, with the config (the workload, target, model info,
  // max_in_flight) under "config".
  nlohmann::json json;
};

// The Generate request for one planned request: its prompt as token ids
// (MakePromptTokenIds over `vocab`), max_tokens = output_tokens with
// ignore_eos so exactly that many tokens are generated, a per-request
// sampling seed, and the QoS class and SLO targets when set.
absl::StatusOr<v1::GenerateRequest> BuildGenerateRequest(const PlannedRequest& planned,
                                                         const PromptVocabulary& vocab,
                                                         const std::string& model);

// Runs the whole schedule against `options.target` and waits for every
// request to end. Before sending, asks the server's ModelInfo for the
// vocabulary and context size.
// Errors: kInvalidArgument for an invalid workload, or one whose prompt plus
// output exceeds the model's max_context_tokens, or a QoS class the server
// does not list; the ModelInfo call's status (e.g. kUnavailable,
// kDeadlineExceeded) when the server cannot be reached; kDeadlineExceeded if
// calls are still in flight long after their deadline.
absl::StatusOr<RunResult> RunLoad(const RunOptions& options);

}  // namespace trident::loadgen

#endif  // TRIDENT_BENCH_LOADGEN_RUNNER_H_
