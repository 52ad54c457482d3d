#ifndef TRIDENT_SERVICES_CONTROLLER_POLICY_ROLE_POLICY_H_
#define TRIDENT_SERVICES_CONTROLLER_POLICY_ROLE_POLICY_H_

// The controller's role policy: once per interval, from the cluster's
// metrics, its workers' roles and a clock, either flip one worker between
// prefill and decode, or hold, and say why. No I/O: the caller reads the
// metrics (ReadClusterSignals), makes the flip (WorkerControl.SetRole) and
// counts the decision.
//
// Pressure. Each role's pressure is the largest of its components, each a
// ratio that reads 1.0 at the role's limit (its SLO, or its capacity):
//
//   prefill   ttft_p90          TTFT p90 / ttft_slo
//             prefill_queue     queued prefill tokens / (measured tokens/s of a
//                               worker * prefill workers), in seconds, / ttft_slo
//             ttft_rejections   share rejected for "ttft" / rejected_ratio_at_capacity
//   decode    tpot_p90          TPOT p90 / tpot_slo
//             kv_usage          KV usage of decode workers / kv_usage_at_capacity
//             decode_waiting    waiting sequences / (decode workers *
//                               waiting_sequences_per_worker_at_capacity)
//             decode_rejections share rejected for "tpot" or "kv_capacity" /
//                               rejected_ratio_at_capacity
//
// each clamped to [0, max_pressure]; a NaN signal (no observation in the
// window, e.g. no request finished) leaves its component out.
//
// Forecast. The policy keeps the last `window_intervals` intervals of both
// pressures and acts on their forecast `horizon_intervals` ahead
// (pressure_forecast.h): a trend moves roles, a lone sample does not. The
// window restarts whenever the set of serving workers or their roles
// changes, so that a forecast never mixes samples of two configurations.
//
// Decision. A role *needs* a worker when its forecast is at least
// `high_pressure`; the other role can *give* one when its forecast, scaled
// to one worker fewer (forecast * n / (n - 1), as if its load spread over
// the rest; an approximation, since latency that does not come from
// queueing, e.g. a long prompt's own compute, does not scale with workers),
// stays at or below `low_pressure`. A flip is made when the
// same role has needed a worker, and the other could give one, for
// `sustain_intervals` consecutive intervals. Because low_pressure <
// high_pressure, the flip cannot undo itself under unchanged load: the
// giver ends at or below low_pressure, short of the high_pressure it would
// need to take the worker back. Between the two thresholds nothing moves.
//
// Guards, checked in this order; each holds with its reason:
//
//   reason               holds when
//   flip_pending         the caller reports a flip still draining
//   metrics_unavailable  the signals are kUnavailable or kDeadlineExceeded
//                        (Prometheus down or silent)
//   series_missing       the signals are kNotFound (a required series absent)
//   metrics_error        the signals carry any other error
//   one_per_interval     this policy ordered a flip less than `interval` ago
//   no_workers           no serving prefill or decode worker at all
//   warming_up           fewer than `min_samples` samples since the window
//                        restarted
//   balanced             neither forecast reaches high_pressure
//   last_worker          the giving role has one serving worker (or none)
//   no_headroom          the giving role would exceed low_pressure
//   sustaining           the need has not lasted sustain_intervals yet
//   dwell                every worker of the giving role changed role less
//                        than `min_dwell` ago
//
// and otherwise flips (reason prefill_pressure or decode_pressure) the
// giving role's serving worker with the least load, then the longest since
// its last role change, then the smallest id. Workers in role `both`, and
// workers not serving, are neither counted nor flipped.

#include <cstdint>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/time/clock.h"
#include "trident/v1/cluster.pb.h"

namespace trident::controller {

inline constexpr double kNoSignal = std::numeric_limits<double>::quiet_NaN();

// What the metrics say about prefill over the last interval.
struct PrefillSignals {
  // Prompt tokens queued for prefill, all prefill workers together.
  double queued_prefill_tokens = 0;
  // Prompt tokens per second one prefill worker computes when busy; NaN or
  // <= 0: not measured yet (prefill_queue is left out).
  double prefill_tokens_per_second_per_worker = kNoSignal;
  // TTFT p90 in seconds; NaN: no first token in the window; +Inf counts as
  // past every bucket.
  double ttft_p90_seconds = kNoSignal;
  // Share of requests rejected at admission for reason "ttft", in [0, 1].
  double ttft_rejected_ratio = 0;
};

// What the metrics say about decode over the last interval.
struct DecodeSignals {
  // TPOT p90 in seconds; NaN: no output tokens in the window.
  double tpot_p90_seconds = kNoSignal;
  // KV-cache usage of the decode workers, averaged, in [0, 1]; NaN: unknown.
  double kv_usage_ratio = kNoSignal;
  // Admitted requests waiting for room on a decode worker.
  double waiting_sequences = 0;
  // Share of requests rejected for reasons "tpot" or "kv_capacity".
  double rejected_ratio = 0;
};

struct ClusterSignals {
  PrefillSignals prefill;
  DecodeSignals decode;
};

// A worker as the controller's membership sees it.
struct WorkerState {
  std::string worker_id;
  trident::v1::Role role = trident::v1::ROLE_UNSPECIFIED;
  // When its role last changed; its registration if it never did.
  absl::Time role_change_time = absl::InfinitePast();
  // Serving in its role. False while it drains, starts or is dead: then it
  // is neither counted nor flipped.
  bool serving = true;
  // Work in flight (e.g. running sequences): the least busy flips first,
  // since its drain is the shortest.
  double load = 0;
};

// Everything the policy sees in one interval.
struct Observation {
  // The interval's signals, or why they could not be read (see the guard
  // table for how each code holds).
  absl::StatusOr<ClusterSignals> signals = ClusterSignals{};
  std::vector<WorkerState> workers;
  // A flip ordered earlier has not completed.
  bool flip_pending = false;
};

enum class DecisionReason {
  kPrefillPressure,
  kDecodePressure,
  kFlipPending,
  kMetricsUnavailable,
  kSeriesMissing,
  kMetricsError,
  kOnePerInterval,
  kNoWorkers,
  kWarmingUp,
  kBalanced,
  kLastWorker,
  kNoHeadroom,
  kSustaining,
  kDwell,
};

// The snake_case names of the guard table ("prefill_pressure", ...): a
// bounded set, fit for a metric label.
absl::string_view DecisionReasonName(DecisionReason reason);

// One role's pressure in a decision.
struct RolePressure {
  // This interval's pressure; NaN when the signals are missing.
  double observed = kNoSignal;
  // The component that set `observed` ("ttft_p90", ...; "none" if no
  // component had a signal).
  std::string dominant;
  // The forecast acted on; NaN while it could not be made (warming up,
  // signals missing, a flip pending).
  double forecast = kNoSignal;
  // Serving workers in the role.
  int32_t workers = 0;
};

struct Decision {
  enum class Action { kHold, kFlip };
  Action action = Action::kHold;
  // For kFlip: the worker, its role now and the role to give it.
  std::string worker_id;
  trident::v1::Role from = trident::v1::ROLE_UNSPECIFIED;
  trident::v1::Role to = trident::v1::ROLE_UNSPECIFIED;
  DecisionReason reason = DecisionReason::kBalanced;
  // One line with the numbers behind the reason, for logs and status.
  std::string detail;
  RolePressure prefill;
  RolePressure decode;
  absl::Time time;
};

// One line: "flip w2 prefill->decode (decode_pressure): ...; prefill 0.21
// (forecast 0.19, 3 workers), decode 1.62 (forecast 1.55, 1 worker)".
std::string DecisionToString(const Decision& decision);

// "prefill", "decode", "both", "unspecified".
absl::string_view RoleName(trident::v1::Role role);

// Every threshold, window and time of the policy; the defaults are the
// controller's flag defaults.
struct RolePolicyOptions {
  // How often the caller calls Decide: the unit of the window, the horizon
  // and the sustain count, and the least time between two flips.
  absl::Duration interval = absl::Seconds(10);
  // Intervals of samples the forecast uses (6: a minute at the default
  // interval, as long as a rate() window, so one slow scrape cannot swing it).
  int32_t window_intervals = 6;
  // Samples needed since the window restarted before the policy acts; in
  // [1, window_intervals]. Three fit a slope to more than two points.
  int32_t min_samples = 3;
  // Weight of the newest sample in the forecast's level, in (0, 1].
  double smoothing = 0.4;
  // How far ahead the forecast looks, in intervals; >= 0.
  double horizon_intervals = 1;
  // A role needs a worker at or above this forecast pressure (act before the
  // SLO, which reads 1.0, is missed).
  double high_pressure = 0.9;
  // A role gives a worker only if, one worker fewer, its forecast stays at or
  // below this; < high_pressure. The gap is the no-action band.
  double low_pressure = 0.7;
  // Consecutive intervals a need must last before a flip (Mooncake: flip on
  // sustained imbalance only); >= 1.
  int32_t sustain_intervals = 3;
  // Least time between two role changes of one worker: longer than a flip's
  // drain (30 s) plus a window, so a worker's new role is judged on its own
  // samples before it can move again.
  absl::Duration min_dwell = absl::Minutes(2);
  // Each component is clamped here (llm-d's SLO-aware autoscaler clamps at
  // 2.0): one runaway signal cannot dominate the window.
  double max_pressure = 2.0;
  // The default QoS class's targets (services/router/admission).
  absl::Duration ttft_slo = absl::Milliseconds(500);
  absl::Duration tpot_slo = absl::Milliseconds(50);
  // KV usage that reads as decode pressure 1.0, in (0, 1].
  double kv_usage_at_capacity = 0.9;
  // Waiting sequences per decode worker that read as pressure 1.0; > 0.
  double waiting_sequences_per_worker_at_capacity = 4;
  // Share of requests rejected for a role's reasons that reads as its
  // pressure 1.0, in (0, 1].
  double rejected_ratio_at_capacity = 0.05;
};

// kInvalidArgument naming the first option out of range.
absl::Status ValidateRolePolicyOptions(const RolePolicyOptions& options);

// Each role's pressure from one interval's signals (the table above), with
// `num_prefill` and `num_decode` serving workers. No forecast.
RolePressure PrefillPressure(const PrefillSignals& signals, int32_t num_prefill,
                             const RolePolicyOptions& options);
RolePressure DecodePressure(const DecodeSignals& signals, int32_t num_decode,
                            const RolePolicyOptions& options);

// Thread-compatible: one caller (the controller's decision loop) drives it.
// Its state: the window of pressures, the serving set it was taken over, the
// need being sustained and the time of its last flip.
class RolePolicy {
 public:
  // kInvalidArgument as ValidateRolePolicyOptions. `clock` is not owned and
  // must outlive the policy.
  static absl::StatusOr<RolePolicy> Create(RolePolicyOptions options, const Clock* clock);

  // The decision for this interval, at the clock's Now(). Records the
  // interval's pressures when the signals are present and no flip is
  // pending. After a kFlip the caller makes the flip and reports it pending
  // until it completes.
  Decision Decide(const Observation& observation);

  const RolePolicyOptions& options() const { return options_; }

 private:
  struct WindowSample {
    absl::Time time;
    double prefill = 0;
    double decode = 0;
  };

  RolePolicy(RolePolicyOptions options, const Clock* clock)
      : options_(std::move(options)), clock_(clock) {}

  // Restarts the window if the serving workers or their roles changed.
  void TrackServingSet(const std::vector<WorkerState>& workers);
  // Appends a sample and drops those older than the window.
  void Record(absl::Time now, double prefill, double decode);
  double Forecast(bool prefill) const;
  // From the forecasts on: need, headroom, sustain, dwell, flip.
  Decision Choose(const std::vector<WorkerState>& workers, Decision decision);
  // The giving role's worker to flip, or nullptr if all are within dwell.
  const WorkerState* PickWorker(const std::vector<WorkerState>& workers,
                                trident::v1::Role role) const;

  RolePolicyOptions options_;
  const Clock* clock_;
  std::deque<WindowSample> window_;
  std::string serving_set_;
  trident::v1::Role sustained_role_ = trident::v1::ROLE_UNSPECIFIED;
  int32_t sustained_intervals_ = 0;
  absl::Time last_flip_time_ = absl::InfinitePast();
};

}  // namespace trident::controller

#endif  // TRIDENT_SERVICES_CONTROLLER_POLICY_ROLE_POLICY_H_
