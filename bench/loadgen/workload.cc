#include "bench/loadgen/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/logging/log.h"
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
// Sample statistics.

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

}  // namespace trident::loadgen
