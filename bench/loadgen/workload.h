#ifndef TRIDENT_BENCH_LOADGEN_WORKLOAD_H_
#define TRIDENT_BENCH_LOADGEN_WORKLOAD_H_

// What the open-loop load generator sends and when: arrival processes,
// length distributions, the QoS/SLO mix, a deterministic schedule, the
// prompts' token ids, and the pacer that releases requests at their times.
// Nothing here talks to the network or reads the time itself; `runner.h`
// drives a real target with it, and `report.h` sums up what came back.
//
// Every random draw comes from `Rng`, seeded from `WorkloadSpec::seed`, with
// one independent stream per purpose (arrivals, lengths, QoS classes,
// prompts), so the same spec always gives the same schedule, and changing
// e.g. the output-length distribution leaves the arrival times unchanged.

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
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
// Sample statistics (of lengths here, of latencies in report.h).

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

}  // namespace trident::loadgen

#endif  // TRIDENT_BENCH_LOADGEN_WORKLOAD_H_
