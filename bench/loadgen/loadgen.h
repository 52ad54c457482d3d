#ifndef TRIDENT_BENCH_LOADGEN_LOADGEN_H_
#define TRIDENT_BENCH_LOADGEN_LOADGEN_H_

// The pure logic of the open-loop load generator: what to send and when
// (arrival processes, length distributions, QoS/SLO mix, a deterministic
// schedule), the per-request records a run collects, and the metrics and
// report computed from them. Nothing here talks to the network or reads the
// time itself; `runner.h` drives a real target with it.
//
// Every random draw comes from `Rng`, seeded from `WorkloadSpec::seed`, with
// one independent stream per purpose (arrivals, lengths, QoS classes,
// prompts), so the same spec always gives the same schedule, and changing
// e.g. the output-length distribution leaves the arrival times unchanged.

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/time/clock.h"
#include "nlohmann/json.hpp"

namespace trident::loadgen {

// A seeded pseudo-random generator whose outputs are the same on every
// platform: std::mt19937_64 (fully specified by the standard) with the
// project's own transforms (the std:: distributions are
// implementation-defined). Thread-compatible.
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}

  uint64_t NextU64() { return engine_(); }
  // Uniform in [0, 1), 53 random bits.
  double Uniform01();
  // Uniform integer in [lo, hi]. REQUIRES: lo <= hi.
  int64_t UniformInt(int64_t lo, int64_t hi);
  // Exponential with the given mean. REQUIRES: mean > 0.
  double Exponential(double mean);
  // Standard normal (Box-Muller).
  double Normal();
  // Gamma with shape k and scale theta (mean k * theta), Marsaglia-Tsang.
  // REQUIRES: shape > 0, scale > 0.
  double Gamma(double shape, double scale);

 private:
  std::mt19937_64 engine_;
};

// The seed of stream `stream` derived from `seed` (SplitMix64 of both), so
// that streams of one seed are independent.
uint64_t DeriveSeed(uint64_t seed, uint64_t stream);

// ---------------------------------------------------------------------------
// Arrivals.

enum class ArrivalKind { kPoisson, kGamma };

// Open-loop arrivals at `rate_per_s` requests per second on average.
// Poisson: exponential gaps. Gamma: gamma-distributed gaps with shape
// `gamma_shape` and mean 1/rate; shape 1 is Poisson, below 1 is burstier
// (coefficient of variation 1/sqrt(shape)), above 1 more regular.
struct ArrivalProcess {
  ArrivalKind kind = ArrivalKind::kPoisson;
  double rate_per_s = 1.0;
  double gamma_shape = 1.0;  // Used by kGamma only.
};

// "poisson" or "gamma"; kInvalidArgument naming `--arrival` otherwise.
absl::StatusOr<ArrivalKind> ParseArrivalKind(absl::string_view text);
absl::string_view ArrivalKindName(ArrivalKind kind);

// kInvalidArgument naming `--rate` or `--gamma_shape` unless both are finite
// and positive.
absl::Status ValidateArrivalProcess(const ArrivalProcess& arrival);

// One gap between consecutive arrivals. REQUIRES: ValidateArrivalProcess ok.
absl::Duration SampleInterArrival(const ArrivalProcess& arrival, Rng& rng);

// ---------------------------------------------------------------------------
// Token-length distributions.

// One row of a lengths CSV file.
struct LengthRow {
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;
};

// Parses CSV text with a header naming the columns `prompt_tokens` and
// `output_tokens` (any order; other columns are ignored) and one row per
// request. Blank lines are skipped; `\r\n` endings are accepted. Every value
// must be an integer >= 1. Errors are kInvalidArgument and start with
// "<path>:<line>: " (`path` is used only in messages). A file without data
// rows is an error.
absl::StatusOr<std::vector<LengthRow>> ParseLengthCsv(absl::string_view content,
                                                      absl::string_view path);
// Reads and parses `path`. kNotFound if it cannot be opened.
absl::StatusOr<std::vector<LengthRow>> ReadLengthCsv(const std::string& path);

enum class LengthColumn { kPrompt, kOutput };

// A distribution of token counts: fixed N, uniform integers in [A, B], or the
// values of one column of a CSV file, drawn by row with replacement.
struct LengthDistribution {
  enum class Kind { kFixed, kUniform, kCsv };
  Kind kind = Kind::kFixed;
  int32_t min_tokens = 1;  // kFixed: the value; kUniform: A.
  int32_t max_tokens = 1;  // kFixed: the value; kUniform: B.
  // kCsv: the file and every row of it (both columns); `column` picks the
  // value. Two distributions over the same file share one row per request.
  std::string csv_path;
  std::vector<LengthRow> csv_rows;
  LengthColumn column = LengthColumn::kPrompt;
  // The spec as given, for reports.
  std::string spec;

  int32_t ValueAt(size_t row) const;
  nlohmann::json ToJson() const;
};

// Parses "fixed:N", "uniform:A:B" (1 <= A <= B) or "csv:PATH" (the file is
// read now). `flag` names the flag in error messages (e.g. "--prompt_tokens").
// kInvalidArgument for a malformed spec or CSV, kNotFound for a missing file.
absl::StatusOr<LengthDistribution> ParseLengthDistribution(absl::string_view spec,
                                                           LengthColumn column,
                                                           absl::string_view flag);

// ---------------------------------------------------------------------------
// QoS classes and SLO targets.

// Latency targets of a request; unset means no target (and the field is not
// sent, so the server's class default applies).
struct SloTargets {
  std::optional<absl::Duration> ttft;
  std::optional<absl::Duration> tpot;
};

// One class of the QoS mix. An empty name sends no `qos_class` (the server's
// default class).
struct QosClassSpec {
  std::string name;
  double weight = 1.0;  // Fraction of requests, normalized over the mix.
  SloTargets slo;
};

// Parses `--qos`: a comma-separated list of `NAME[:WEIGHT][:ttft=MS][:tpot=MS]`,
// e.g. "interactive:0.3:ttft=200:tpot=50,batch:0.7:ttft=5000". WEIGHT defaults
// to 1 and is normalized over the list; targets not given per class come
// from `default_slo` (from --ttft_slo_ms / --tpot_slo_ms). An empty spec is
// one unnamed class. kInvalidArgument naming `--qos` for duplicate or invalid
// names (printable ASCII, at most 64 bytes), non-positive weights or targets,
// or unknown keys.
absl::StatusOr<std::vector<QosClassSpec>> ParseQosMix(absl::string_view spec,
                                                      const SloTargets& default_slo);

// ---------------------------------------------------------------------------
// The schedule.

struct WorkloadSpec {
  uint64_t seed = 0;
  ArrivalProcess arrival;
  // Arrivals stop at the first of: `duration` passed (if > 0) or
  // `num_requests` generated (if > 0). At least one must be set.
  absl::Duration duration = absl::ZeroDuration();
  int64_t num_requests = 0;
  // Requests scheduled before `warmup` are sent but left out of the metrics.
  absl::Duration warmup = absl::ZeroDuration();
  LengthDistribution prompt_tokens;
  LengthDistribution output_tokens;
  std::vector<QosClassSpec> qos;  // At least one class.
};

// One request of the schedule.
struct PlannedRequest {
  int64_t index = 0;
  absl::Duration send_offset;  // From the start of the run; non-decreasing.
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;
  std::string qos_class;
  SloTargets slo;
  uint64_t prompt_seed = 0;  // Seeds MakePromptTokenIds.
  bool measured = true;      // send_offset >= warmup.
};

// The most requests one schedule may hold.
inline constexpr int64_t kMaxScheduledRequests = 10'000'000;

// The deterministic schedule of `spec`. kInvalidArgument naming the flag if
// the spec is invalid (no stop condition, bad arrival process, empty QoS
// mix) or if it would exceed kMaxScheduledRequests.
absl::StatusOr<std::vector<PlannedRequest>> GenerateSchedule(const WorkloadSpec& spec);

// Token ids a prompt may use: [0, vocab_size) minus `excluded_ids` (the
// model's special tokens, so a prompt never contains BOS/EOS).
struct PromptVocabulary {
  int32_t vocab_size = 0;
  std::vector<int32_t> excluded_ids;
};

// `num_tokens` ids drawn uniformly from the allowed ids, determined by
// `prompt_seed`. kInvalidArgument if no id is allowed.
absl::StatusOr<std::vector<int32_t>> MakePromptTokenIds(uint64_t prompt_seed, int32_t num_tokens,
                                                        const PromptVocabulary& vocab);

// Sends due requests at their scheduled times: the step-driven core of the
// open-loop sender. The caller asks what is due at the current time and
// sends it, never waiting for responses. Thread-compatible.
class OpenLoopPacer {
 public:
  // `offsets` are the schedule's send offsets (non-decreasing) from `start`.
  OpenLoopPacer(std::vector<absl::Duration> offsets, absl::Time start);

  bool done() const { return next_ == offsets_.size(); }
  // When the next request is due. REQUIRES: !done().
  absl::Time next_send_time() const { return start_ + offsets_[next_]; }
  // Positions (into `offsets`) of every request due at `now` not yet taken,
  // in order.
  std::vector<size_t> TakeDue(absl::Time now);

 private:
  std::vector<absl::Duration> offsets_;
  absl::Time start_;
  size_t next_ = 0;
};

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

// Summary of a sample, in milliseconds. Percentiles interpolate linearly
// between closest ranks (numpy's default), so p50 <= p90 <= p99 <= max.
struct LatencyStats {
  int64_t count = 0;
  double mean_ms = 0;
  double p50_ms = 0;
  double p90_ms = 0;
  double p99_ms = 0;
  double max_ms = 0;

  nlohmann::json ToJson() const;
};

// Stats of `values_ms` (any order). All zeros for an empty sample.
LatencyStats ComputeStats(std::vector<double> values_ms);

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

#endif  // TRIDENT_BENCH_LOADGEN_LOADGEN_H_
