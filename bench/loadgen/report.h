#ifndef TRIDENT_BENCH_LOADGEN_REPORT_H_
#define TRIDENT_BENCH_LOADGEN_REPORT_H_

// What a load-generator run observed and what it reports: the per-request
// records a run collects (RequestRecorder, RecordBook), the latency metrics
// and SLO outcomes computed from them, and the report as text, JSON and CSV.
// Nothing here talks to the network or reads the time itself.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/loadgen/workload.h"
#include "common/time/clock.h"
#include "nlohmann/json.hpp"

namespace trident::loadgen {

// ---------------------------------------------------------------------------
// Records and metrics.

// How generation ended, as the stream's `complete` said.
enum class FinishReason { kNone, kStop, kLength, kAbort, kError };

// A chunk of tokens as it arrived.
struct ChunkArrival {
  absl::Time time;
  int32_t num_tokens = 0;
};

// Everything observed about one request.
struct RequestRecord {
  PlannedRequest planned;
  absl::Time scheduled;              // Run start + planned.send_offset.
  absl::Time sent;                   // When the call was started; unset for drops.
  bool dropped = false;              // Not sent: the --max_inflight cap was reached.
  std::vector<ChunkArrival> chunks;  // Only chunks with tokens.
  bool has_complete = false;
  FinishReason finish_reason = FinishReason::kNone;
  int32_t completion_tokens = 0;  // From complete.usage.
  absl::Time end;                 // When the call ended.
  absl::Status status;            // The call's final status, with payloads.

  int64_t tokens_received() const;
};

// Stamps one request's events with the time of `clock`. Thread-compatible:
// the reactions of one RPC, which feed it, are serialized by gRPC.
class RequestRecorder {
 public:
  // `clock` must outlive the recorder.
  RequestRecorder(Clock* clock, RequestRecord record) : clock_(clock), record_(std::move(record)) {}

  void Sent() { record_.sent = clock_->Now(); }
  // A chunk of `num_tokens` tokens arrived; empty chunks are ignored.
  void Chunk(int32_t num_tokens);
  // The stream's `complete` arrived.
  void Complete(FinishReason reason, int32_t completion_tokens);
  // The call ended with `status`; returns the finished record.
  RequestRecord Done(absl::Status status);

  const RequestRecord& record() const { return record_; }

 private:
  Clock* const clock_;
  RequestRecord record_;
};

// What became of a request.
enum class Outcome {
  kCompleted,  // OK, and `complete` said stop or length.
  kRejected,   // Non-OK status before any token (admission, validation).
  kFailed,     // Accepted, then failed: an error after tokens, abort, error finish.
  kDropped,    // Never sent (client-side --max_inflight cap).
};
Outcome OutcomeOf(const RequestRecord& record);
absl::string_view OutcomeName(Outcome outcome);

// The rejection reason of a status: its message with digit runs replaced by
// "#" (so "predicted TTFT 312 ms" groups with "predicted TTFT 290 ms"),
// whitespace collapsed, at most 120 characters.
std::string RejectionReason(const absl::Status& status);

// The upper-case name of a status code, e.g. "RESOURCE_EXHAUSTED".
std::string StatusCodeName(absl::StatusCode code);

// Per-request latencies. TTFT: first token - sent, unset without tokens.
// TPOT: (last token - first token) / (tokens - 1), unset below 2 tokens.
// E2E: end - sent.
std::optional<absl::Duration> TimeToFirstToken(const RequestRecord& record);
std::optional<absl::Duration> TimePerOutputToken(const RequestRecord& record);
// Inter-token gaps: for every chunk after the first, the gap since the
// previous chunk, split evenly over its tokens (one sample per token).
std::vector<absl::Duration> InterTokenLatencies(const RequestRecord& record);

// Whether a completed request met every target it had (a TPOT target is met
// by a request with fewer than 2 tokens). False for any other outcome.
bool MetSlo(const RequestRecord& record);

// Rejections that share a status code and reason.
struct RejectionGroup {
  std::string code;
  std::string reason;
  int64_t count = 0;
  int64_t with_retry_info = 0;
  LatencyStats time_to_reject;  // From send to the status.
  LatencyStats retry_delay;     // RetryInfo delays, where given.
};

struct ClassSummary {
  int64_t measured = 0;
  int64_t completed = 0;
  int64_t rejected = 0;
  int64_t failed = 0;
  int64_t slo_met = 0;
  std::optional<double> slo_attainment;  // slo_met / (completed + failed).
};

// The metrics of a run, over its measured requests (scheduled at or after
// the warmup). The measured window runs from run start + warmup to the last
// end of a measured request; rates are per second of it.
struct Report {
  int64_t num_scheduled = 0;  // All records, warmup included.
  int64_t num_warmup = 0;
  int64_t num_measured = 0;
  int64_t num_completed = 0;
  int64_t num_rejected = 0;
  int64_t num_failed = 0;
  int64_t num_dropped = 0;
  int64_t num_slo_met = 0;
  // Completed requests whose token count differs from the requested one.
  int64_t num_wrong_length = 0;
  double measured_window_s = 0;

  LatencyStats ttft;
  LatencyStats tpot;
  LatencyStats itl;
  LatencyStats e2e;
  // E2E over the output tokens of each completed request: NEO's "normalized
  // latency" (its mean is the figure its sweeps report).
  LatencyStats normalized;
  LatencyStats send_lag;  // sent - scheduled: how well the sender kept time.

  double goodput_rps = 0;                // Completed requests that met their SLOs, per s.
  double request_throughput_rps = 0;     // Completed requests per s.
  double output_tokens_per_s = 0;        // Tokens received by measured requests, per s.
  double input_tokens_per_s = 0;         // Prompt tokens of completed requests, per s.
  std::optional<double> slo_attainment;  // slo_met / (completed + failed).

  std::map<std::string, int64_t> rejections_by_code;
  std::vector<RejectionGroup> rejections;         // Most frequent first.
  std::map<std::string, ClassSummary> per_class;  // Keyed by class ("" = default).
};

// Computes the report. `start` is the run's start.
Report Summarize(const std::vector<RequestRecord>& records, absl::Time start,
                 absl::Duration warmup);

// The workload's configuration, for the report.
nlohmann::json WorkloadToJson(const WorkloadSpec& spec);

// The report as JSON: {"config": config, "requests": {...}, "latency_ms":
// {"ttft", "tpot", "itl", "e2e", "send_lag"}, "throughput": {...}, "slo":
// {...}, "rejections": {...}, "per_class": {...}}. Missing ratios are null.
nlohmann::json ReportToJson(const Report& report, const nlohmann::json& config);

// A human-readable multi-line summary.
// One CSV row per measured request, for distributions (CDF plots) beyond
// the report's percentiles. Header: index,qos_class,scheduled_s,outcome,
// prompt_tokens,output_tokens,tokens_received,ttft_ms,tpot_ms,e2e_ms,slo_met.
// scheduled_s counts from `start`; ttft_ms / tpot_ms / e2e_ms are empty
// where the request has none (see TimeToFirstToken and friends).
std::string RequestsCsv(const std::vector<RequestRecord>& records, absl::Time start);

std::string FormatReport(const Report& report);

// ---------------------------------------------------------------------------
// Collecting records during a run.

// Counts of a run so far, for the progress line.
struct Progress {
  int64_t sent = 0;
  int64_t in_flight = 0;
  int64_t done = 0;  // Completed or failed.
  int64_t rejected = 0;
  int64_t dropped = 0;
};

// "t=12s sent=120 in_flight=5 done=110 rejected=3 dropped=2".
std::string FormatProgress(absl::Duration elapsed, const Progress& progress);

// Where a run's records go: admission against the in-flight cap, finished
// records, and counts. Thread-safe.
class RecordBook {
 public:
  // REQUIRES: max_in_flight >= 1.
  explicit RecordBook(int64_t max_in_flight);

  // Counts a request as sent and returns true if fewer than max_in_flight
  // are in flight; otherwise stores `record` as dropped and returns false.
  bool TryAdmit(const RequestRecord& record) ABSL_LOCKS_EXCLUDED(mu_);
  // Stores the record of an admitted request that has ended.
  void Finish(RequestRecord record) ABSL_LOCKS_EXCLUDED(mu_);

  Progress progress() const ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until nothing is in flight or `deadline` passes; returns whether
  // nothing is in flight.
  bool AwaitIdle(absl::Time deadline) const ABSL_LOCKS_EXCLUDED(mu_);
  // Every stored record, ordered by index.
  std::vector<RequestRecord> TakeRecords() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int64_t max_in_flight_;
  mutable absl::Mutex mu_;
  Progress progress_ ABSL_GUARDED_BY(mu_);
  std::vector<RequestRecord> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::loadgen

#endif  // TRIDENT_BENCH_LOADGEN_REPORT_H_
