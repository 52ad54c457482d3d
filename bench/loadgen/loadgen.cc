#include "bench/loadgen/loadgen.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/logging/log.h"
#include "common/status/error_details.h"
#include "common/status/status_macros.h"

namespace trident::loadgen {
namespace {

constexpr double kPi = 3.14159265358979323846;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Streams of one seed; the values are part of the schedule's definition.
enum Stream : uint64_t {
  kArrivalStream = 1,
  kLengthStream = 2,
  kQosStream = 3,
  kPromptStream = 4,
};

double ToMs(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

bool IsPositiveFinite(double x) { return std::isfinite(x) && x > 0; }

absl::Status CheckLengths(const LengthDistribution& d, absl::string_view flag) {
  switch (d.kind) {
    case LengthDistribution::Kind::kFixed:
    case LengthDistribution::Kind::kUniform:
      if (d.min_tokens < 1 || d.min_tokens > d.max_tokens) {
        return absl::InvalidArgumentError(absl::StrCat(
            flag, ": token counts must satisfy 1 <= ", d.min_tokens, " <= ", d.max_tokens));
      }
      return absl::OkStatus();
    case LengthDistribution::Kind::kCsv:
      if (d.csv_rows.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(flag, ": ", d.csv_path, " has no rows"));
      }
      return absl::OkStatus();
  }
  return absl::InternalError("unknown length distribution kind");
}

int32_t SampleLength(const LengthDistribution& d, Rng& rng, std::optional<size_t>* shared_row,
                     const std::string* shared_path) {
  switch (d.kind) {
    case LengthDistribution::Kind::kFixed:
      return d.min_tokens;
    case LengthDistribution::Kind::kUniform:
      return static_cast<int32_t>(rng.UniformInt(d.min_tokens, d.max_tokens));
    case LengthDistribution::Kind::kCsv:
      break;
  }
  // The prompt and output columns of one file come from the same row, so
  // the file's joint distribution is kept.
  if (shared_row->has_value() && shared_path != nullptr && *shared_path == d.csv_path) {
    return d.ValueAt(**shared_row);
  }
  const size_t row =
      static_cast<size_t>(rng.UniformInt(0, static_cast<int64_t>(d.csv_rows.size()) - 1));
  *shared_row = row;
  return d.ValueAt(row);
}

absl::StatusOr<absl::Duration> ParseMillis(absl::string_view text, absl::string_view what) {
  double ms = 0;
  if (!absl::SimpleAtod(text, &ms) || !IsPositiveFinite(ms)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--qos: ", what, " must be a positive number of milliseconds, got \"", text, "\""));
  }
  return absl::Milliseconds(ms);
}

nlohmann::json OptionalMs(const std::optional<absl::Duration>& d) {
  if (!d.has_value()) return nullptr;
  return ToMs(*d);
}

nlohmann::json OptionalRatio(const std::optional<double>& r) {
  if (!r.has_value()) return nullptr;
  return *r;
}

}  // namespace

// ---------------------------------------------------------------------------
// Rng.

double Rng::Uniform01() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

int64_t Rng::UniformInt(int64_t lo, int64_t hi) {
  TRIDENT_CHECK(lo <= hi) << "UniformInt(" << lo << ", " << hi << ")";
  const uint64_t range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;
  if (range == 0) return static_cast<int64_t>(NextU64());  // The full 64-bit range.
  // Rejection keeps every value equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % range;
  uint64_t x = NextU64();
  while (x >= limit) x = NextU64();
  return static_cast<int64_t>(static_cast<uint64_t>(lo) + x % range);
}

double Rng::Exponential(double mean) { return -mean * std::log1p(-Uniform01()); }

double Rng::Normal() {
  const double u1 = 1.0 - Uniform01();  // (0, 1]: log(u1) is finite.
  const double u2 = Uniform01();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
}

double Rng::Gamma(double shape, double scale) {
  if (shape < 1.0) {
    // Gamma(k) = Gamma(k + 1) * U^(1/k) (Marsaglia and Tsang, section 6).
    const double u = 1.0 - Uniform01();
    return Gamma(shape + 1.0, scale) * std::pow(u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  while (true) {
    const double x = Normal();
    double v = 1.0 + c * x;
    if (v <= 0.0) continue;
    v = v * v * v;
    const double u = Uniform01();
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v * scale;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v * scale;
  }
}

uint64_t DeriveSeed(uint64_t seed, uint64_t stream) {
  return SplitMix64(seed ^ SplitMix64(stream));
}

// ---------------------------------------------------------------------------
// Arrivals.

absl::StatusOr<ArrivalKind> ParseArrivalKind(absl::string_view text) {
  if (text == "poisson") return ArrivalKind::kPoisson;
  if (text == "gamma") return ArrivalKind::kGamma;
  return absl::InvalidArgumentError(
      absl::StrCat("--arrival: expected poisson or gamma, got \"", text, "\""));
}

absl::string_view ArrivalKindName(ArrivalKind kind) {
  return kind == ArrivalKind::kPoisson ? "poisson" : "gamma";
}

absl::Status ValidateArrivalProcess(const ArrivalProcess& arrival) {
  if (!IsPositiveFinite(arrival.rate_per_s)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rate: must be a positive number of requests per second, got ", arrival.rate_per_s));
  }
  if (arrival.kind == ArrivalKind::kGamma && !IsPositiveFinite(arrival.gamma_shape)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gamma_shape: must be positive, got ", arrival.gamma_shape));
  }
  return absl::OkStatus();
}

absl::Duration SampleInterArrival(const ArrivalProcess& arrival, Rng& rng) {
  const double mean_s = 1.0 / arrival.rate_per_s;
  double gap_s = 0;
  if (arrival.kind == ArrivalKind::kPoisson) {
    gap_s = rng.Exponential(mean_s);
  } else {
    gap_s = rng.Gamma(arrival.gamma_shape, mean_s / arrival.gamma_shape);
  }
  return absl::Seconds(gap_s);
}

// ---------------------------------------------------------------------------
// Lengths.

absl::StatusOr<std::vector<LengthRow>> ParseLengthCsv(absl::string_view content,
                                                      absl::string_view path) {
  absl::ConsumePrefix(&content, "\xEF\xBB\xBF");  // A UTF-8 byte order mark.
  std::vector<LengthRow> rows;
  int prompt_col = -1;
  int output_col = -1;
  size_t num_cols = 0;
  bool have_header = false;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(content, '\n')) {
    ++line_no;
    absl::ConsumeSuffix(&line, "\r");
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ',');
    for (absl::string_view& f : fields) f = absl::StripAsciiWhitespace(f);
    if (!have_header) {
      for (size_t i = 0; i < fields.size(); ++i) {
        int* col = fields[i] == "prompt_tokens"   ? &prompt_col
                   : fields[i] == "output_tokens" ? &output_col
                                                  : nullptr;
        if (col == nullptr) continue;
        if (*col >= 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ":", line_no, ": column \"", fields[i], "\" appears twice"));
        }
        *col = static_cast<int>(i);
      }
      if (prompt_col < 0 || output_col < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", line_no,
                         ": the header must name the columns prompt_tokens and output_tokens, "
                         "got \"",
                         line, "\""));
      }
      num_cols = fields.size();
      have_header = true;
      continue;
    }
    if (fields.size() != num_cols) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": expected ", num_cols,
                                                     " fields as in the header, got ",
                                                     fields.size()));
    }
    LengthRow row;
    for (auto [col, name, out] :
         {std::make_tuple(prompt_col, "prompt_tokens", &row.prompt_tokens),
          std::make_tuple(output_col, "output_tokens", &row.output_tokens)}) {
      const absl::string_view text = fields[static_cast<size_t>(col)];
      int32_t value = 0;
      if (!absl::SimpleAtoi(text, &value)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", line_no, ": ", name, " \"", text, "\" is not an integer"));
      }
      if (value < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", line_no, ": ", name, " must be at least 1, got ", value));
      }
      *out = value;
    }
    rows.push_back(row);
  }
  if (!have_header) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": empty; expected a header naming prompt_tokens and output_tokens, then rows"));
  }
  if (rows.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no data rows after the header"));
  }
  return rows;
}

absl::StatusOr<std::vector<LengthRow>> ReadLengthCsv(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open lengths CSV \"", path, "\""));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading \"", path, "\""));
  return ParseLengthCsv(buffer.str(), path);
}

int32_t LengthDistribution::ValueAt(size_t row) const {
  const LengthRow& r = csv_rows.at(row);
  return column == LengthColumn::kPrompt ? r.prompt_tokens : r.output_tokens;
}

nlohmann::json LengthDistribution::ToJson() const {
  nlohmann::json j;
  j["spec"] = spec;
  switch (kind) {
    case Kind::kFixed:
      j["kind"] = "fixed";
      j["tokens"] = min_tokens;
      break;
    case Kind::kUniform:
      j["kind"] = "uniform";
      j["min_tokens"] = min_tokens;
      j["max_tokens"] = max_tokens;
      break;
    case Kind::kCsv: {
      j["kind"] = "csv";
      j["path"] = csv_path;
      j["column"] = column == LengthColumn::kPrompt ? "prompt_tokens" : "output_tokens";
      j["rows"] = csv_rows.size();
      std::vector<double> values;
      for (size_t i = 0; i < csv_rows.size(); ++i) values.push_back(ValueAt(i));
      const LatencyStats s = ComputeStats(values);
      j["mean_tokens"] = s.mean_ms;
      j["max_tokens"] = s.max_ms;
      break;
    }
  }
  return j;
}

absl::StatusOr<LengthDistribution> ParseLengthDistribution(absl::string_view spec,
                                                           LengthColumn column,
                                                           absl::string_view flag) {
  LengthDistribution d;
  d.spec = std::string(spec);
  d.column = column;
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": ", why, "; expected fixed:N, uniform:A:B or csv:PATH, got \"", spec, "\""));
  };
  if (absl::StartsWith(spec, "csv:")) {
    d.kind = LengthDistribution::Kind::kCsv;
    d.csv_path = std::string(spec.substr(4));
    if (d.csv_path.empty()) return bad("empty path");
    absl::StatusOr<std::vector<LengthRow>> rows = ReadLengthCsv(d.csv_path);
    if (!rows.ok()) {
      return absl::Status(rows.status().code(), absl::StrCat(flag, ": ", rows.status().message()));
    }
    d.csv_rows = *std::move(rows);
    return d;
  }
  std::vector<absl::string_view> parts = absl::StrSplit(spec, ':');
  std::vector<int32_t> values;
  for (size_t i = 1; i < parts.size(); ++i) {
    int32_t v = 0;
    if (!absl::SimpleAtoi(parts[i], &v))
      return bad(absl::StrCat("\"", parts[i], "\" is not an integer"));
    if (v < 1) return bad("token counts must be at least 1");
    values.push_back(v);
  }
  if (parts[0] == "fixed" && values.size() == 1) {
    d.kind = LengthDistribution::Kind::kFixed;
    d.min_tokens = d.max_tokens = values[0];
    return d;
  }
  if (parts[0] == "uniform" && values.size() == 2) {
    if (values[0] > values[1]) return bad("A must not exceed B");
    d.kind = LengthDistribution::Kind::kUniform;
    d.min_tokens = values[0];
    d.max_tokens = values[1];
    return d;
  }
  return bad("unknown form");
}

// ---------------------------------------------------------------------------
// QoS.

absl::StatusOr<std::vector<QosClassSpec>> ParseQosMix(absl::string_view spec,
                                                      const SloTargets& default_slo) {
  std::vector<QosClassSpec> classes;
  if (absl::StripAsciiWhitespace(spec).empty()) {
    classes.push_back(QosClassSpec{.name = "", .weight = 1.0, .slo = default_slo});
    return classes;
  }
  std::set<std::string> names;
  double total = 0;
  for (absl::string_view entry : absl::StrSplit(spec, ',')) {
    std::vector<absl::string_view> parts = absl::StrSplit(entry, ':');
    QosClassSpec c{.name = std::string(parts[0]), .weight = 1.0, .slo = default_slo};
    if (c.name.empty() || c.name.size() > 64 ||
        !std::all_of(c.name.begin(), c.name.end(),
                     [](char ch) { return ch >= 0x21 && ch <= 0x7e; })) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--qos: class name \"", c.name, "\" must be 1 to 64 printable ASCII characters"));
    }
    if (!names.insert(c.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--qos: class \"", c.name, "\" appears twice"));
    }
    for (size_t i = 1; i < parts.size(); ++i) {
      absl::string_view p = parts[i];
      if (absl::ConsumePrefix(&p, "ttft=")) {
        TRIDENT_ASSIGN_OR_RETURN(c.slo.ttft, ParseMillis(p, absl::StrCat(c.name, " ttft")));
      } else if (absl::ConsumePrefix(&p, "tpot=")) {
        TRIDENT_ASSIGN_OR_RETURN(c.slo.tpot, ParseMillis(p, absl::StrCat(c.name, " tpot")));
      } else if (i == 1) {  // The weight comes first if given.
        if (!absl::SimpleAtod(p, &c.weight) || !IsPositiveFinite(c.weight)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--qos: weight of \"", c.name, "\" must be a positive number, got \"", p, "\""));
        }
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--qos: unexpected \"", p, "\" in \"", entry,
                         "\"; expected NAME[:WEIGHT][:ttft=MS][:tpot=MS]"));
      }
    }
    total += c.weight;
    classes.push_back(std::move(c));
  }
  for (QosClassSpec& c : classes) c.weight /= total;
  return classes;
}

// ---------------------------------------------------------------------------
// Schedule.

absl::StatusOr<std::vector<PlannedRequest>> GenerateSchedule(const WorkloadSpec& spec) {
  TRIDENT_RETURN_IF_ERROR(ValidateArrivalProcess(spec.arrival));
  if (spec.duration < absl::ZeroDuration() || spec.num_requests < 0 ||
      (spec.duration == absl::ZeroDuration() && spec.num_requests == 0)) {
    return absl::InvalidArgumentError(
        "--duration_s or --num_requests: set at least one to a positive value");
  }
  if (spec.warmup < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--warmup_s: must not be negative");
  }
  if (spec.num_requests > kMaxScheduledRequests) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_requests: at most ", kMaxScheduledRequests));
  }
  TRIDENT_RETURN_IF_ERROR(CheckLengths(spec.prompt_tokens, "--prompt_tokens"));
  TRIDENT_RETURN_IF_ERROR(CheckLengths(spec.output_tokens, "--output_tokens"));
  if (spec.qos.empty()) return absl::InvalidArgumentError("--qos: no class");

  Rng arrival_rng(DeriveSeed(spec.seed, kArrivalStream));
  Rng length_rng(DeriveSeed(spec.seed, kLengthStream));
  Rng qos_rng(DeriveSeed(spec.seed, kQosStream));
  Rng prompt_rng(DeriveSeed(spec.seed, kPromptStream));

  std::vector<PlannedRequest> schedule;
  absl::Duration t = absl::ZeroDuration();
  while (spec.num_requests == 0 || static_cast<int64_t>(schedule.size()) < spec.num_requests) {
    t += SampleInterArrival(spec.arrival, arrival_rng);
    if (spec.duration > absl::ZeroDuration() && t >= spec.duration) break;
    if (static_cast<int64_t>(schedule.size()) >= kMaxScheduledRequests) {
      return absl::InvalidArgumentError(
          absl::StrCat("--rate and --duration_s: the schedule would exceed ", kMaxScheduledRequests,
                       " requests"));
    }
    PlannedRequest r;
    r.index = static_cast<int64_t>(schedule.size());
    r.send_offset = t;
    r.measured = t >= spec.warmup;
    std::optional<size_t> row;
    r.prompt_tokens = SampleLength(spec.prompt_tokens, length_rng, &row, nullptr);
    const std::string* prompt_csv = spec.prompt_tokens.kind == LengthDistribution::Kind::kCsv
                                        ? &spec.prompt_tokens.csv_path
                                        : nullptr;
    r.output_tokens = SampleLength(spec.output_tokens, length_rng, &row, prompt_csv);
    const QosClassSpec* cls = &spec.qos.front();
    if (spec.qos.size() > 1) {
      double u = qos_rng.Uniform01();
      for (const QosClassSpec& c : spec.qos) {
        cls = &c;
        if (u < c.weight) break;
        u -= c.weight;
      }
    }
    r.qos_class = cls->name;
    r.slo = cls->slo;
    r.prompt_seed = prompt_rng.NextU64();
    schedule.push_back(std::move(r));
  }
  return schedule;
}

absl::StatusOr<std::vector<int32_t>> MakePromptTokenIds(uint64_t prompt_seed, int32_t num_tokens,
                                                        const PromptVocabulary& vocab) {
  std::vector<int32_t> excluded;
  for (int32_t id : vocab.excluded_ids) {
    if (id >= 0 && id < vocab.vocab_size) excluded.push_back(id);
  }
  std::sort(excluded.begin(), excluded.end());
  excluded.erase(std::unique(excluded.begin(), excluded.end()), excluded.end());
  const int64_t num_allowed = static_cast<int64_t>(vocab.vocab_size) - excluded.size();
  if (num_allowed <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("no token id is allowed in a prompt: vocab_size ", vocab.vocab_size, ", ",
                     excluded.size(), " special ids excluded"));
  }
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_tokens must not be negative, got ", num_tokens));
  }
  Rng rng(prompt_seed);
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(num_tokens));
  for (int32_t i = 0; i < num_tokens; ++i) {
    // The k-th allowed id: step over every excluded id at or below it.
    int64_t id = rng.UniformInt(0, num_allowed - 1);
    for (int32_t e : excluded) {
      if (e <= id) ++id;
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

OpenLoopPacer::OpenLoopPacer(std::vector<absl::Duration> offsets, absl::Time start)
    : offsets_(std::move(offsets)), start_(start) {}

std::vector<size_t> OpenLoopPacer::TakeDue(absl::Time now) {
  std::vector<size_t> due;
  while (next_ < offsets_.size() && start_ + offsets_[next_] <= now) due.push_back(next_++);
  return due;
}

// ---------------------------------------------------------------------------
// Records.

int64_t RequestRecord::tokens_received() const {
  int64_t n = 0;
  for (const ChunkArrival& c : chunks) n += c.num_tokens;
  return n;
}

void RequestRecorder::Chunk(int32_t num_tokens) {
  if (num_tokens <= 0) return;
  record_.chunks.push_back(ChunkArrival{.time = clock_->Now(), .num_tokens = num_tokens});
}

void RequestRecorder::Complete(FinishReason reason, int32_t completion_tokens) {
  record_.has_complete = true;
  record_.finish_reason = reason;
  record_.completion_tokens = completion_tokens;
}

RequestRecord RequestRecorder::Done(absl::Status status) {
  record_.end = clock_->Now();
  record_.status = std::move(status);
  return std::move(record_);
}

Outcome OutcomeOf(const RequestRecord& record) {
  if (record.dropped) return Outcome::kDropped;
  if (record.status.ok()) {
    const bool normal = record.has_complete && (record.finish_reason == FinishReason::kStop ||
                                                record.finish_reason == FinishReason::kLength);
    return normal ? Outcome::kCompleted : Outcome::kFailed;
  }
  // The client's own deadline or cancellation is a failure, not a rejection
  // by the server.
  if (record.status.code() == absl::StatusCode::kCancelled ||
      record.status.code() == absl::StatusCode::kDeadlineExceeded) {
    return Outcome::kFailed;
  }
  return record.chunks.empty() ? Outcome::kRejected : Outcome::kFailed;
}

absl::string_view OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kCompleted:
      return "completed";
    case Outcome::kRejected:
      return "rejected";
    case Outcome::kFailed:
      return "failed";
    case Outcome::kDropped:
      return "dropped";
  }
  return "unknown";
}

std::string RejectionReason(const absl::Status& status) {
  std::string out;
  bool in_space = false;
  for (char c : status.message()) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
      in_space = true;
      continue;
    }
    if (in_space && !out.empty()) out.push_back(' ');
    in_space = false;
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      out.push_back(c);
    } else if (out.empty() || out.back() != '#') {
      out.push_back('#');
    }
  }
  constexpr size_t kMaxChars = 120;
  if (out.size() > kMaxChars) {
    size_t cut = kMaxChars;
    // Never split a UTF-8 sequence: back off over continuation bytes.
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
    out.resize(cut);
  }
  if (out.empty()) out = "(no message)";
  return out;
}

std::string StatusCodeName(absl::StatusCode code) { return absl::StatusCodeToString(code); }

// ---------------------------------------------------------------------------
// Metrics.

nlohmann::json LatencyStats::ToJson() const {
  return {{"count", count}, {"mean", mean_ms}, {"p50", p50_ms},
          {"p90", p90_ms},  {"p99", p99_ms},   {"max", max_ms}};
}

LatencyStats ComputeStats(std::vector<double> values) {
  LatencyStats s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.count = static_cast<int64_t>(values.size());
  double sum = 0;
  for (double v : values) sum += v;
  s.mean_ms = sum / static_cast<double>(values.size());
  const auto percentile = [&](double q) {
    const double pos = q * static_cast<double>(values.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(lo + 1, values.size() - 1);
    const double v = values[lo] + (values[hi] - values[lo]) * (pos - static_cast<double>(lo));
    // Clamped so rounding never breaks p50 <= p90 <= p99 <= max.
    return std::clamp(v, values[lo], values[hi]);
  };
  s.p50_ms = percentile(0.50);
  s.p90_ms = percentile(0.90);
  s.p99_ms = percentile(0.99);
  s.max_ms = values.back();
  return s;
}

std::optional<absl::Duration> TimeToFirstToken(const RequestRecord& record) {
  if (record.chunks.empty()) return std::nullopt;
  return record.chunks.front().time - record.sent;
}

std::optional<absl::Duration> TimePerOutputToken(const RequestRecord& record) {
  const int64_t n = record.tokens_received();
  if (n < 2) return std::nullopt;
  return (record.chunks.back().time - record.chunks.front().time) / (n - 1);
}

std::vector<absl::Duration> InterTokenLatencies(const RequestRecord& record) {
  std::vector<absl::Duration> gaps;
  for (size_t i = 1; i < record.chunks.size(); ++i) {
    const ChunkArrival& c = record.chunks[i];
    const absl::Duration per_token = (c.time - record.chunks[i - 1].time) / c.num_tokens;
    for (int32_t k = 0; k < c.num_tokens; ++k) gaps.push_back(per_token);
  }
  return gaps;
}

bool MetSlo(const RequestRecord& record) {
  if (OutcomeOf(record) != Outcome::kCompleted) return false;
  const SloTargets& slo = record.planned.slo;
  if (slo.ttft.has_value()) {
    const std::optional<absl::Duration> ttft = TimeToFirstToken(record);
    if (!ttft.has_value() || *ttft > *slo.ttft) return false;
  }
  if (slo.tpot.has_value()) {
    const std::optional<absl::Duration> tpot = TimePerOutputToken(record);
    if (tpot.has_value() && *tpot > *slo.tpot) return false;
  }
  return true;
}

Report Summarize(const std::vector<RequestRecord>& records, absl::Time start,
                 absl::Duration warmup) {
  Report report;
  report.num_scheduled = static_cast<int64_t>(records.size());
  std::vector<double> ttft, tpot, itl, e2e, normalized, lag;
  int64_t output_tokens = 0;
  int64_t input_tokens = 0;
  const absl::Time window_start = start + warmup;
  absl::Time window_end = window_start;
  struct Group {
    int64_t count = 0;
    int64_t with_retry_info = 0;
    std::vector<double> time_to_reject;
    std::vector<double> retry_delay;
  };
  std::map<std::pair<std::string, std::string>, Group> groups;

  for (const RequestRecord& r : records) {
    if (!r.planned.measured) {
      ++report.num_warmup;
      continue;
    }
    ++report.num_measured;
    ClassSummary& cls = report.per_class[r.planned.qos_class];
    ++cls.measured;
    const Outcome outcome = OutcomeOf(r);
    if (outcome == Outcome::kDropped) {
      ++report.num_dropped;
      window_end = std::max(window_end, r.scheduled);
      continue;
    }
    window_end = std::max(window_end, r.end);
    lag.push_back(ToMs(r.sent - r.scheduled));
    output_tokens += r.tokens_received();
    switch (outcome) {
      case Outcome::kCompleted: {
        ++report.num_completed;
        ++cls.completed;
        input_tokens += r.planned.prompt_tokens;
        if (r.tokens_received() != r.planned.output_tokens ||
            r.completion_tokens != r.planned.output_tokens) {
          ++report.num_wrong_length;
        }
        if (std::optional<absl::Duration> t = TimeToFirstToken(r)) ttft.push_back(ToMs(*t));
        if (std::optional<absl::Duration> t = TimePerOutputToken(r)) tpot.push_back(ToMs(*t));
        for (absl::Duration gap : InterTokenLatencies(r)) itl.push_back(ToMs(gap));
        e2e.push_back(ToMs(r.end - r.sent));
        if (r.tokens_received() > 0) {
          normalized.push_back(ToMs(r.end - r.sent) / static_cast<double>(r.tokens_received()));
        }
        if (MetSlo(r)) {
          ++report.num_slo_met;
          ++cls.slo_met;
        }
        break;
      }
      case Outcome::kRejected: {
        ++report.num_rejected;
        ++cls.rejected;
        const std::string code = StatusCodeName(r.status.code());
        ++report.rejections_by_code[code];
        Group& g = groups[{code, RejectionReason(r.status)}];
        ++g.count;
        g.time_to_reject.push_back(ToMs(r.end - r.sent));
        if (std::optional<absl::Duration> delay = GetRetryDelay(r.status)) {
          ++g.with_retry_info;
          g.retry_delay.push_back(ToMs(*delay));
        }
        break;
      }
      case Outcome::kFailed:
        ++report.num_failed;
        ++cls.failed;
        break;
      case Outcome::kDropped:
        break;
    }
  }

  report.ttft = ComputeStats(std::move(ttft));
  report.tpot = ComputeStats(std::move(tpot));
  report.itl = ComputeStats(std::move(itl));
  report.e2e = ComputeStats(std::move(e2e));
  report.normalized = ComputeStats(std::move(normalized));
  report.send_lag = ComputeStats(std::move(lag));
  report.measured_window_s = absl::ToDoubleSeconds(window_end - window_start);
  if (report.measured_window_s > 0) {
    const double w = report.measured_window_s;
    report.goodput_rps = static_cast<double>(report.num_slo_met) / w;
    report.request_throughput_rps = static_cast<double>(report.num_completed) / w;
    report.output_tokens_per_s = static_cast<double>(output_tokens) / w;
    report.input_tokens_per_s = static_cast<double>(input_tokens) / w;
  }
  const int64_t accepted = report.num_completed + report.num_failed;
  if (accepted > 0) {
    report.slo_attainment = static_cast<double>(report.num_slo_met) / static_cast<double>(accepted);
  }
  for (auto& [name, cls] : report.per_class) {
    const int64_t cls_accepted = cls.completed + cls.failed;
    if (cls_accepted > 0) {
      cls.slo_attainment = static_cast<double>(cls.slo_met) / static_cast<double>(cls_accepted);
    }
  }
  for (auto& [key, g] : groups) {
    report.rejections.push_back(RejectionGroup{
        .code = key.first,
        .reason = key.second,
        .count = g.count,
        .with_retry_info = g.with_retry_info,
        .time_to_reject = ComputeStats(std::move(g.time_to_reject)),
        .retry_delay = ComputeStats(std::move(g.retry_delay)),
    });
  }
  std::stable_sort(
      report.rejections.begin(), report.rejections.end(),
      [](const RejectionGroup& a, const RejectionGroup& b) { return a.count > b.count; });
  return report;
}

nlohmann::json WorkloadToJson(const WorkloadSpec& spec) {
  nlohmann::json arrival = {{"kind", ArrivalKindName(spec.arrival.kind)},
                            {"rate_per_s", spec.arrival.rate_per_s}};
  if (spec.arrival.kind == ArrivalKind::kGamma) arrival["gamma_shape"] = spec.arrival.gamma_shape;
  nlohmann::json qos = nlohmann::json::array();
  for (const QosClassSpec& c : spec.qos) {
    qos.push_back({{"name", c.name},
                   {"weight", c.weight},
                   {"ttft_slo_ms", OptionalMs(c.slo.ttft)},
                   {"tpot_slo_ms", OptionalMs(c.slo.tpot)}});
  }
  return {
      {"seed", spec.seed},
      {"arrival", arrival},
      {"duration_s", absl::ToDoubleSeconds(spec.duration)},
      {"num_requests", spec.num_requests},
      {"warmup_s", absl::ToDoubleSeconds(spec.warmup)},
      {"prompt_tokens", spec.prompt_tokens.ToJson()},
      {"output_tokens", spec.output_tokens.ToJson()},
      {"qos", qos},
  };
}

nlohmann::json ReportToJson(const Report& report, const nlohmann::json& config) {
  nlohmann::json groups = nlohmann::json::array();
  for (const RejectionGroup& g : report.rejections) {
    groups.push_back({{"code", g.code},
                      {"reason", g.reason},
                      {"count", g.count},
                      {"with_retry_info", g.with_retry_info},
                      {"time_to_reject_ms", g.time_to_reject.ToJson()},
                      {"retry_delay_ms", g.retry_delay.ToJson()}});
  }
  nlohmann::json per_class = nlohmann::json::object();
  for (const auto& [name, c] : report.per_class) {
    per_class[name.empty() ? "(default)" : name] = {
        {"measured", c.measured}, {"completed", c.completed},
        {"rejected", c.rejected}, {"failed", c.failed},
        {"slo_met", c.slo_met},   {"slo_attainment", OptionalRatio(c.slo_attainment)}};
  }
  return {
      {"config", config},
      {"requests",
       {{"scheduled", report.num_scheduled},
        {"warmup", report.num_warmup},
        {"measured", report.num_measured},
        {"completed", report.num_completed},
        {"rejected", report.num_rejected},
        {"failed", report.num_failed},
        {"dropped", report.num_dropped},
        {"slo_met", report.num_slo_met},
        {"wrong_length", report.num_wrong_length}}},
      {"measured_window_s", report.measured_window_s},
      {"latency_ms",
       {{"ttft", report.ttft.ToJson()},
        {"tpot", report.tpot.ToJson()},
        {"itl", report.itl.ToJson()},
        {"e2e", report.e2e.ToJson()},
        {"normalized_per_token", report.normalized.ToJson()},
        {"send_lag", report.send_lag.ToJson()}}},
      {"throughput",
       {{"goodput_rps", report.goodput_rps},
        {"request_rps", report.request_throughput_rps},
        {"output_tokens_per_s", report.output_tokens_per_s},
        {"input_tokens_per_s", report.input_tokens_per_s}}},
      {"slo", {{"met", report.num_slo_met}, {"attainment", OptionalRatio(report.slo_attainment)}}},
      {"rejections", {{"by_code", report.rejections_by_code}, {"groups", groups}}},
      {"per_class", per_class},
  };
}

std::string RequestsCsv(const std::vector<RequestRecord>& records, absl::Time start) {
  std::string out =
      "index,qos_class,scheduled_s,outcome,prompt_tokens,output_tokens,tokens_received,ttft_ms,"
      "tpot_ms,e2e_ms,slo_met\n";
  const auto ms = [](std::optional<absl::Duration> d) {
    return d.has_value() ? absl::StrFormat("%.3f", absl::ToDoubleMilliseconds(*d)) : "";
  };
  for (const RequestRecord& r : records) {
    if (!r.planned.measured) continue;
    const Outcome outcome = OutcomeOf(r);
    // E2E as the report counts it: completed requests only.
    const std::optional<absl::Duration> e2e =
        outcome == Outcome::kCompleted ? std::optional(r.end - r.sent) : std::nullopt;
    absl::StrAppendFormat(&out, "%d,%s,%.6f,%s,%d,%d,%d,%s,%s,%s,%d\n", r.planned.index,
                          r.planned.qos_class, absl::ToDoubleSeconds(r.scheduled - start),
                          OutcomeName(outcome), r.planned.prompt_tokens, r.planned.output_tokens,
                          r.tokens_received(), ms(TimeToFirstToken(r)), ms(TimePerOutputToken(r)),
                          ms(e2e), MetSlo(r) ? 1 : 0);
  }
  return out;
}

std::string FormatReport(const Report& r) {
  std::string out = absl::StrFormat(
      "requests: %d measured (%d warmup not counted): %d completed, %d rejected, %d failed, "
      "%d dropped by --max_inflight\n",
      r.num_measured, r.num_warmup, r.num_completed, r.num_rejected, r.num_failed, r.num_dropped);
  if (r.num_wrong_length > 0) {
    absl::StrAppendFormat(&out, "WARNING: %d completed requests had the wrong output length\n",
                          r.num_wrong_length);
  }
  absl::StrAppendFormat(&out,
                        "window: %.2f s  goodput: %.3f req/s  throughput: %.3f req/s, %.1f output "
                        "tok/s, %.1f input tok/s\n",
                        r.measured_window_s, r.goodput_rps, r.request_throughput_rps,
                        r.output_tokens_per_s, r.input_tokens_per_s);
  if (r.slo_attainment.has_value()) {
    absl::StrAppendFormat(&out, "SLO attainment: %.1f%% (%d of %d accepted)\n",
                          100 * *r.slo_attainment, r.num_slo_met, r.num_completed + r.num_failed);
  }
  absl::StrAppendFormat(&out, "%-10s %8s %10s %10s %10s %10s %10s\n", "(ms)", "count", "mean",
                        "p50", "p90", "p99", "max");
  for (const auto& [name, s] : {std::pair<const char*, const LatencyStats&>{"TTFT", r.ttft},
                                {"TPOT", r.tpot},
                                {"ITL", r.itl},
                                {"E2E", r.e2e},
                                {"E2E/token", r.normalized},
                                {"send lag", r.send_lag}}) {
    absl::StrAppendFormat(&out, "%-10s %8d %10.2f %10.2f %10.2f %10.2f %10.2f\n", name, s.count,
                          s.mean_ms, s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms);
  }
  if (r.per_class.size() > 1) {
    for (const auto& [name, c] : r.per_class) {
      absl::StrAppendFormat(&out, "class %s: %d measured, %d completed, %d rejected, %d failed",
                            name.empty() ? "(default)" : name, c.measured, c.completed, c.rejected,
                            c.failed);
      if (c.slo_attainment.has_value()) {
        absl::StrAppendFormat(&out, ", SLO attainment %.1f%%", 100 * *c.slo_attainment);
      }
      out += "\n";
    }
  }
  for (const RejectionGroup& g : r.rejections) {
    absl::StrAppendFormat(&out,
                          "rejected %d x %s \"%s\" (RetryInfo on %d; send to reject p50 %.2f ms, "
                          "p99 %.2f ms)\n",
                          g.count, g.code, g.reason, g.with_retry_info, g.time_to_reject.p50_ms,
                          g.time_to_reject.p99_ms);
  }
  return out;
}

std::string FormatProgress(absl::Duration elapsed, const Progress& p) {
  return absl::StrFormat("t=%.0fs sent=%d in_flight=%d done=%d rejected=%d dropped=%d",
                         absl::ToDoubleSeconds(elapsed), p.sent, p.in_flight, p.done, p.rejected,
                         p.dropped);
}

// ---------------------------------------------------------------------------
// RecordBook.

RecordBook::RecordBook(int64_t max_in_flight) : max_in_flight_(max_in_flight) {
  TRIDENT_CHECK(max_in_flight >= 1) << "max_in_flight " << max_in_flight;
}

bool RecordBook::TryAdmit(const RequestRecord& record) {
  absl::MutexLock lock(&mu_);
  if (progress_.in_flight >= max_in_flight_) {
    ++progress_.dropped;
    records_.push_back(record);
    records_.back().dropped = true;
    return false;
  }
  ++progress_.sent;
  ++progress_.in_flight;
  return true;
}

void RecordBook::Finish(RequestRecord record) {
  absl::MutexLock lock(&mu_);
  TRIDENT_CHECK(progress_.in_flight > 0) << "Finish without TryAdmit";
  --progress_.in_flight;
  if (OutcomeOf(record) == Outcome::kRejected) {
    ++progress_.rejected;
  } else {
    ++progress_.done;
  }
  records_.push_back(std::move(record));
}

Progress RecordBook::progress() const {
  absl::MutexLock lock(&mu_);
  return progress_;
}

bool RecordBook::AwaitIdle(absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  const auto idle = [this]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return progress_.in_flight == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

std::vector<RequestRecord> RecordBook::TakeRecords() {
  absl::MutexLock lock(&mu_);
  std::vector<RequestRecord> out = std::move(records_);
  records_.clear();
  std::sort(out.begin(), out.end(), [](const RequestRecord& a, const RequestRecord& b) {
    return a.planned.index < b.planned.index;
  });
  return out;
}

}  // namespace trident::loadgen
