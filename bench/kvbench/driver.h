// Runs kvbench sessions (workload.h) against a trident.v1.Generation server:
// sessions start at their scheduled times on a fixed pool of client threads
// (one session at a time each); a session's turns go one after another,
// each a greedy streaming Generate with exactly its output tokens. A chat
// turn's prompt is the history (every earlier prompt and the answer the
// server gave) plus its new message.

#ifndef TRIDENT_BENCH_KVBENCH_DRIVER_H_
#define TRIDENT_BENCH_KVBENCH_DRIVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/kvbench/workload.h"
#include "nlohmann/json.hpp"

namespace trident::kvbench {

struct DriverOptions {
  std::string target;  // host:port
  int32_t threads = 64;
  absl::Duration request_timeout = absl::Minutes(5);
  // Targets for goodput.
  absl::Duration ttft_slo = absl::Milliseconds(300);
  absl::Duration tpot_slo = absl::Milliseconds(25);
  // No turn starts this long after the run's start (an overloaded server
  // must not hold a benchmark forever); the summary counts what ran.
  absl::Duration max_run = absl::InfiniteDuration();
};

// What one request saw.
struct RequestResult {
  int64_t session = 0;
  int32_t turn = 0;
  absl::Duration send_offset;  // From the run's start.
  absl::Duration send_lag;     // How late it was sent.
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  int32_t wanted_tokens = 0;
  int32_t cached_tokens = 0;
  int32_t dram_cached_tokens = 0;
  bool ok = false;
  std::string error;
  absl::Duration ttft = absl::InfiniteDuration();
  absl::Duration e2e;
  absl::Duration tpot;  // (last - first) / (tokens - 1); zero below 2.
};

struct RunSummary {
  int64_t requests = 0;
  int64_t failed = 0;
  double window_s = 0;
  double ttft_p50_ms = 0, ttft_p90_ms = 0, ttft_p99_ms = 0;
  double tpot_p50_ms = 0, tpot_p90_ms = 0;
  double goodput_rps = 0;  // Requests within both targets, per second.
  double throughput_rps = 0;
  double hit_rate = 0;       // Cached prompt tokens over prompt tokens.
  double dram_hit_rate = 0;  // Of them, fetched from the DRAM tier.
  double ideal_hit_rate = 0;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  double send_lag_p99_ms = 0;
  std::string first_error;

  nlohmann::json ToJson() const;
  std::string Format() const;
};

// Runs every session; waits for all. UNAVAILABLE if the server cannot be
// reached at the start.
absl::StatusOr<std::vector<RequestResult>> RunSessions(const std::vector<Session>& sessions,
                                                       const DriverOptions& options);

// The summary of results; `block_tokens` for the ideal hit rate.
RunSummary Summarize(const std::vector<RequestResult>& results, const DriverOptions& options,
                     int32_t block_tokens);

// A client of `target` for GenerateOnce (one connection, reused).
class Generator {
 public:
  explicit Generator(const std::string& target);
  ~Generator();
  // One greedy generation of exactly `output_tokens`, now.
  RequestResult GenerateOnce(const std::vector<int32_t>& prompt, int32_t output_tokens,
                             absl::Duration timeout = absl::Minutes(5));

 private:
  struct Stub;
  std::unique_ptr<Stub> stub_;
};

// The vocabulary the server's model declares (ModelInfo).
absl::StatusOr<Vocabulary> FetchVocabulary(const std::string& target);

}  // namespace trident::kvbench

#endif  // TRIDENT_BENCH_KVBENCH_DRIVER_H_
