#include "bench/loadgen/report.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging/log.h"
#include "common/status/error_details.h"

namespace trident::loadgen {
namespace {

double ToMs(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

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
