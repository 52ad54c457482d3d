#include "services/controller/policy/role_policy.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "services/controller/policy/pressure_forecast.h"

namespace trident::controller {
namespace {

using trident::v1::Role;

struct Component {
  const char* name;
  double value;  // NaN: no signal.
};

// The largest component, each clamped to [0, max_pressure]; +Inf clamps to
// the top, NaN is left out.
RolePressure Combine(std::initializer_list<Component> components, double max_pressure,
                     int32_t workers) {
  RolePressure pressure{.observed = 0, .dominant = "none", .workers = workers};
  for (const Component& c : components) {
    if (std::isnan(c.value)) continue;
    const double value = std::clamp(c.value, 0.0, max_pressure);
    if (pressure.dominant == "none" || value > pressure.observed) {
      pressure.observed = value;
      pressure.dominant = c.name;
    }
  }
  return pressure;
}

// `amount` spread over `workers`, at `per_worker_limit` each reading 1.0.
// With no workers, any amount is the most pressure there is.
double PerWorker(double amount, int32_t workers, double per_worker_limit, double max_pressure) {
  if (workers > 0) return amount / (per_worker_limit * workers);
  return amount > 0 ? max_pressure : 0;
}

int32_t CountServing(const std::vector<WorkerState>& workers, Role role) {
  return static_cast<int32_t>(std::count_if(workers.begin(), workers.end(), [role](const auto& w) {
    return w.serving && w.role == role;
  }));
}

DecisionReason ReasonForMissing(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return DecisionReason::kMetricsUnavailable;
    case absl::StatusCode::kNotFound:
      return DecisionReason::kSeriesMissing;
    default:
      return DecisionReason::kMetricsError;
  }
}

Decision Hold(Decision decision, DecisionReason reason, std::string detail) {
  decision.action = Decision::Action::kHold;
  decision.reason = reason;
  decision.detail = std::move(detail);
  return decision;
}

std::string Fmt(double value) { return absl::StrFormat("%.2f", value); }

std::string DescribePressure(absl::string_view role, const RolePressure& p) {
  std::string out = absl::StrCat(role, " ", Fmt(p.observed));
  if (!std::isnan(p.observed)) absl::StrAppend(&out, " ", p.dominant);
  if (!std::isnan(p.forecast)) absl::StrAppend(&out, " forecast ", Fmt(p.forecast));
  absl::StrAppend(&out, " (", p.workers, p.workers == 1 ? " worker)" : " workers)");
  return out;
}

}  // namespace

absl::string_view DecisionReasonName(DecisionReason reason) {
  switch (reason) {
    case DecisionReason::kPrefillPressure:
      return "prefill_pressure";
    case DecisionReason::kDecodePressure:
      return "decode_pressure";
    case DecisionReason::kFlipPending:
      return "flip_pending";
    case DecisionReason::kMetricsUnavailable:
      return "metrics_unavailable";
    case DecisionReason::kSeriesMissing:
      return "series_missing";
    case DecisionReason::kMetricsError:
      return "metrics_error";
    case DecisionReason::kOnePerInterval:
      return "one_per_interval";
    case DecisionReason::kNoWorkers:
      return "no_workers";
    case DecisionReason::kWarmingUp:
      return "warming_up";
    case DecisionReason::kBalanced:
      return "balanced";
    case DecisionReason::kLastWorker:
      return "last_worker";
    case DecisionReason::kNoHeadroom:
      return "no_headroom";
    case DecisionReason::kSustaining:
      return "sustaining";
    case DecisionReason::kDwell:
      return "dwell";
  }
  return "unknown";
}

absl::string_view RoleName(Role role) {
  switch (role) {
    case trident::v1::ROLE_PREFILL:
      return "prefill";
    case trident::v1::ROLE_DECODE:
      return "decode";
    case trident::v1::ROLE_BOTH:
      return "both";
    default:
      return "unspecified";
  }
}

std::string DecisionToString(const Decision& d) {
  const std::string head =
      d.action == Decision::Action::kFlip
          ? absl::StrCat("flip ", d.worker_id, " ", RoleName(d.from), "->", RoleName(d.to))
          : std::string("hold");
  return absl::StrCat(head, " (", DecisionReasonName(d.reason), "): ", d.detail, "; ",
                      DescribePressure("prefill", d.prefill), ", ",
                      DescribePressure("decode", d.decode));
}

absl::Status ValidateRolePolicyOptions(const RolePolicyOptions& o) {
  auto fail = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("role policy: ", what));
  };
  if (o.interval <= absl::ZeroDuration()) return fail("interval must be positive");
  if (o.window_intervals < 1) return fail("window_intervals must be at least 1");
  if (o.min_samples < 1 || o.min_samples > o.window_intervals) {
    return fail("min_samples must be in [1, window_intervals]");
  }
  if (!(o.smoothing > 0 && o.smoothing <= 1)) return fail("smoothing must be in (0, 1]");
  if (!(o.horizon_intervals >= 0)) return fail("horizon_intervals must be >= 0");
  if (!(o.low_pressure > 0 && o.low_pressure < o.high_pressure)) {
    return fail("low_pressure must be in (0, high_pressure)");
  }
  if (!(o.high_pressure <= o.max_pressure)) return fail("high_pressure must be <= max_pressure");
  if (o.sustain_intervals < 1) return fail("sustain_intervals must be at least 1");
  if (o.min_dwell < absl::ZeroDuration()) return fail("min_dwell must be >= 0");
  if (o.ttft_slo <= absl::ZeroDuration() || o.tpot_slo <= absl::ZeroDuration()) {
    return fail("ttft_slo and tpot_slo must be positive");
  }
  if (!(o.kv_usage_at_capacity > 0 && o.kv_usage_at_capacity <= 1)) {
    return fail("kv_usage_at_capacity must be in (0, 1]");
  }
  if (!(o.waiting_sequences_per_worker_at_capacity > 0)) {
    return fail("waiting_sequences_per_worker_at_capacity must be positive");
  }
  if (!(o.rejected_ratio_at_capacity > 0 && o.rejected_ratio_at_capacity <= 1)) {
    return fail("rejected_ratio_at_capacity must be in (0, 1]");
  }
  return absl::OkStatus();
}

RolePressure PrefillPressure(const PrefillSignals& s, int32_t num_prefill,
                             const RolePolicyOptions& o) {
  const double slo = absl::ToDoubleSeconds(o.ttft_slo);
  const double per_worker = s.prefill_tokens_per_second_per_worker;
  // Seconds of queued work per worker, against the TTFT target.
  const double queue = per_worker > 0 ? PerWorker(s.queued_prefill_tokens, num_prefill,
                                                  per_worker * slo, o.max_pressure)
                                      : kNoSignal;
  return Combine({{"ttft_p90", s.ttft_p90_seconds / slo},
                  {"prefill_queue", queue},
                  {"ttft_rejections", s.ttft_rejected_ratio / o.rejected_ratio_at_capacity}},
                 o.max_pressure, num_prefill);
}

RolePressure DecodePressure(const DecodeSignals& s, int32_t num_decode,
                            const RolePolicyOptions& o) {
  return Combine(
      {{"tpot_p90", s.tpot_p90_seconds / absl::ToDoubleSeconds(o.tpot_slo)},
       {"kv_usage", s.kv_usage_ratio / o.kv_usage_at_capacity},
       {"decode_waiting", PerWorker(s.waiting_sequences, num_decode,
                                    o.waiting_sequences_per_worker_at_capacity, o.max_pressure)},
       {"decode_rejections", s.rejected_ratio / o.rejected_ratio_at_capacity}},
      o.max_pressure, num_decode);
}

absl::StatusOr<RolePolicy> RolePolicy::Create(RolePolicyOptions options, const Clock* clock) {
  if (absl::Status valid = ValidateRolePolicyOptions(options); !valid.ok()) return valid;
  return RolePolicy(std::move(options), clock);
}

void RolePolicy::TrackServingSet(const std::vector<WorkerState>& workers) {
  std::vector<std::string> members;
  for (const WorkerState& w : workers) {
    if (w.serving) members.push_back(absl::StrCat(w.worker_id, "=", RoleName(w.role)));
  }
  std::sort(members.begin(), members.end());
  std::string serving_set = absl::StrJoin(members, ",");
  if (serving_set != serving_set_) {
    // Samples of another configuration say nothing about this one.
    window_.clear();
    sustained_intervals_ = 0;
    serving_set_ = std::move(serving_set);
  }
}

void RolePolicy::Record(absl::Time now, double prefill, double decode) {
  window_.push_back(WindowSample{now, prefill, decode});
  const absl::Time oldest = now - options_.interval * options_.window_intervals;
  while (!window_.empty() && window_.front().time <= oldest) window_.pop_front();
}

double RolePolicy::Forecast(bool prefill) const {
  std::vector<PressureSample> samples;
  samples.reserve(window_.size());
  for (const WindowSample& s : window_) {
    samples.push_back({s.time, prefill ? s.prefill : s.decode});
  }
  return ForecastPressure(samples, {.smoothing = options_.smoothing,
                                    .horizon_intervals = options_.horizon_intervals,
                                    .interval = options_.interval});
}

Decision RolePolicy::Decide(const Observation& observation) {
  const absl::Time now = clock_->Now();
  Decision decision{.time = now};
  const int32_t num_prefill = CountServing(observation.workers, trident::v1::ROLE_PREFILL);
  const int32_t num_decode = CountServing(observation.workers, trident::v1::ROLE_DECODE);
  decision.prefill.workers = num_prefill;
  decision.decode.workers = num_decode;
  TrackServingSet(observation.workers);
  if (observation.signals.ok()) {
    decision.prefill = PrefillPressure(observation.signals->prefill, num_prefill, options_);
    decision.decode = DecodePressure(observation.signals->decode, num_decode, options_);
  }
  if (observation.flip_pending) {
    sustained_intervals_ = 0;
    return Hold(decision, DecisionReason::kFlipPending, "a flip ordered earlier is not done");
  }
  if (!observation.signals.ok()) {
    // A gap breaks "consecutive"; the window keeps what it has and ages.
    sustained_intervals_ = 0;
    const absl::Status& status = observation.signals.status();
    return Hold(decision, ReasonForMissing(status.code()),
                absl::StrCat("holding every role: ", status.message()));
  }
  if (now - last_flip_time_ < options_.interval) {
    return Hold(decision, DecisionReason::kOnePerInterval,
                absl::StrCat("last flip ", absl::FormatDuration(now - last_flip_time_),
                             " ago, interval ", absl::FormatDuration(options_.interval)));
  }
  if (num_prefill + num_decode == 0) {
    return Hold(decision, DecisionReason::kNoWorkers, "no serving prefill or decode worker");
  }
  Record(now, decision.prefill.observed, decision.decode.observed);
  if (static_cast<int32_t>(window_.size()) < options_.min_samples) {
    return Hold(decision, DecisionReason::kWarmingUp,
                absl::StrCat(window_.size(), " of ", options_.min_samples,
                             " samples in the window (it restarts when the serving set "
                             "changes)"));
  }
  decision.prefill.forecast = Forecast(/*prefill=*/true);
  decision.decode.forecast = Forecast(/*prefill=*/false);
  return Choose(observation.workers, std::move(decision));
}

Decision RolePolicy::Choose(const std::vector<WorkerState>& workers, Decision decision) {
  const double high = options_.high_pressure;
  const bool prefill_needs =
      decision.prefill.forecast >= high && decision.prefill.forecast >= decision.decode.forecast;
  const bool decode_needs = !prefill_needs && decision.decode.forecast >= high;
  if (!prefill_needs && !decode_needs) {
    sustained_intervals_ = 0;
    return Hold(decision, DecisionReason::kBalanced,
                absl::StrCat("both forecasts below ", Fmt(high)));
  }
  const Role to = prefill_needs ? trident::v1::ROLE_PREFILL : trident::v1::ROLE_DECODE;
  const Role from = prefill_needs ? trident::v1::ROLE_DECODE : trident::v1::ROLE_PREFILL;
  const RolePressure& taker = prefill_needs ? decision.prefill : decision.decode;
  const RolePressure& giver = prefill_needs ? decision.decode : decision.prefill;
  const std::string need = absl::StrCat(RoleName(to), " needs a worker (forecast ",
                                        Fmt(taker.forecast), " >= ", Fmt(high), ")");
  if (giver.workers <= 1) {
    sustained_intervals_ = 0;
    return Hold(decision, DecisionReason::kLastWorker,
                absl::StrCat(need, " but ", RoleName(from), " has ", giver.workers,
                             " serving worker", giver.workers == 1 ? "" : "s"));
  }
  const double giver_after = giver.forecast * giver.workers / (giver.workers - 1);
  if (giver_after > options_.low_pressure) {
    sustained_intervals_ = 0;
    return Hold(decision, DecisionReason::kNoHeadroom,
                absl::StrCat(need, " but ", RoleName(from), " with one worker fewer would be at ",
                             Fmt(giver_after), " > ", Fmt(options_.low_pressure)));
  }
  if (sustained_role_ != to) sustained_intervals_ = 0;
  sustained_role_ = to;
  ++sustained_intervals_;
  if (sustained_intervals_ < options_.sustain_intervals) {
    return Hold(decision, DecisionReason::kSustaining,
                absl::StrCat(need, " for ", sustained_intervals_, " of ",
                             options_.sustain_intervals, " intervals"));
  }
  const WorkerState* chosen = PickWorker(workers, from);
  if (chosen == nullptr) {
    // The need stays sustained: the flip goes ahead once a worker's dwell ends.
    return Hold(decision, DecisionReason::kDwell,
                absl::StrCat(need, " but every ", RoleName(from), " worker changed role within ",
                             absl::FormatDuration(options_.min_dwell)));
  }
  decision.action = Decision::Action::kFlip;
  decision.worker_id = chosen->worker_id;
  decision.from = from;
  decision.to = to;
  decision.reason =
      prefill_needs ? DecisionReason::kPrefillPressure : DecisionReason::kDecodePressure;
  decision.detail = absl::StrCat(need, " for ", sustained_intervals_,
                                 sustained_intervals_ == 1 ? " interval; " : " intervals; ",
                                 RoleName(from), " with one worker fewer at ", Fmt(giver_after));
  last_flip_time_ = decision.time;
  window_.clear();
  sustained_intervals_ = 0;
  return decision;
}

const WorkerState* RolePolicy::PickWorker(const std::vector<WorkerState>& workers,
                                          Role role) const {
  const absl::Time now = clock_->Now();
  const WorkerState* best = nullptr;
  for (const WorkerState& w : workers) {
    if (!w.serving || w.role != role) continue;
    if (now - w.role_change_time < options_.min_dwell) continue;
    if (best == nullptr ||
        std::make_tuple(w.load, w.role_change_time, w.worker_id) <
            std::make_tuple(best->load, best->role_change_time, best->worker_id)) {
      best = &w;
    }
  }
  return best;
}

}  // namespace trident::controller
