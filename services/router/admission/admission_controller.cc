#include "services/router/admission/admission_controller.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/status/error_details.h"
#include "common/status/status_macros.h"
#include "services/router/admission/rolling_quantile.h"

namespace trident::router::admission {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Stages of the decision, in the order a candidate pair passes them. A
// rejection reports the furthest stage any candidate failed at.
enum Stage : int {
  kStagePassed = 0,
  kStageKv = 1,
  kStageDecodeClass = 2,
  kStageTpot = 3,
  kStagePrefillClass = 4,
  kStageTtft = 5,
};

absl::Duration ToDuration(double seconds) {
  return std::isfinite(seconds) ? absl::Seconds(seconds) : absl::InfiniteDuration();
}

double ToSeconds(const absl::optional<absl::Duration>& d) {
  return d.has_value() ? absl::ToDoubleSeconds(*d) : kInf;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

absl::string_view RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kTtft:
      return "ttft";
    case RejectReason::kTpot:
      return "tpot";
    case RejectReason::kKvCapacity:
      return "kv_capacity";
    case RejectReason::kNoWorkers:
      return "no_workers";
    case RejectReason::kClassCapacity:
      return "class_capacity";
  }
  return "unknown";
}

absl::Status RejectionStatus(const AdmissionDecision& decision) {
  return ResourceExhaustedWithRetry(
      absl::StrCat("admission rejected the request (reason ", RejectReasonName(decision.reason),
                   "): predicted TTFT ", absl::FormatDuration(decision.predicted_ttft),
                   ", predicted TPOT ", absl::FormatDuration(decision.predicted_tpot),
                   "; retry after ", absl::FormatDuration(decision.retry_after)),
      decision.retry_after);
}

struct AdmissionController::Record {
  uint32_t generation = 1;
  bool in_use = false;
  bool prefill_done = false;
  int prefill = -1;
  int decode = -1;
  int klass = 0;
  int64_t prompt_tokens = 0;
  // Of those, what its prefill worker computes (the rest is cached there):
  // what the request adds to that worker's queue.
  int64_t prefill_tokens = 0;
  int64_t max_output_tokens = 0;
  int64_t blocks = 0;
  // Seconds since origin_.
  double admitted = 0;
  // Predicted start of decoding until prefill_done, then the actual one.
  double decode_start = 0;
  // TPOT predicted at admission.
  double tpot = 0;
  // The request's TPOT target; kInf if none.
  double tpot_target = kInf;
  // The prefill worker's report_seq at admission: while equal, the prompt
  // counts in the worker's `*_since_report` sums.
  uint64_t prefill_report_seq = 0;
  // Position in the decode worker's `decode_records`.
  uint32_t decode_pos = 0;
  // The TTFT forecast at admission (its scale-1 value is the prediction
  // before calibration), the TPOT prediction before calibration, and whether
  // the outcomes were observed.
  TtftForecast ttft_forecast;
  double raw_tpot = 0;
  bool ttft_observed = false;
  bool tpot_observed = false;
};

struct AdmissionController::Worker {
  Worker(std::string worker_id, const AdmissionOptions& options, size_t num_classes)
      : id(std::move(worker_id)),
        prefill_model(options.prefill_model),
        decode_model(options.decode_model),
        class_prefill_tokens(num_classes, 0),
        class_kv_blocks(num_classes, 0),
        ttft_calibration(options.calibration_window, options.calibration_max_age,
                         options.calibration_quantile),
        tpot_calibration(options.calibration_window, options.calibration_max_age,
                         options.calibration_quantile) {}

  std::string id;
  bool present = true;
  bool has_report = false;
  WorkerLoadReport report;
  double received = 0;
  uint64_t report_seq = 0;
  PrefillModel prefill_model;
  DecodeModel decode_model;
  // Prefill side: prompts admitted since the last report (not in its queue).
  int64_t tokens_since_report = 0;
  int64_t requests_since_report = 0;
  // Prompt tokens admitted and not yet prefilled, per class.
  std::vector<int64_t> class_prefill_tokens;
  // Prompts admitted here and not yet prefilled, whatever the reports say,
  // and since when the worker has been computing them (the admission that
  // found it idle of ours, or its last prefill of ours that ended).
  int64_t outstanding_requests = 0;
  int64_t outstanding_tokens = 0;
  double outstanding_since = 0;
  // Those prompts as (slot, generation), in admission order; entries whose
  // record is prefilled or released are dropped lazily from the front.
  std::deque<std::pair<uint32_t, uint32_t>> outstanding;
  // Decode side: slots of the records decoding (or to decode) here.
  std::vector<uint32_t> decode_records;
  // KV blocks (prompt + max output) of those records, per class.
  std::vector<int64_t> class_kv_blocks;
  // Released since the last report but still in it: sequences running then,
  // their context, and the blocks they held then.
  double released_sequences = 0;
  double released_context_tokens = 0;
  double released_blocks = 0;
  // Outcomes against predictions: TTFT errors here as a prefill worker, TPOT
  // ratios as a decode worker.
  RollingQuantile ttft_calibration;
  RollingQuantile tpot_calibration;
  // The outcomes behind ttft_calibration, (when, forecast, measured), so
  // that its factors follow the overhead as it is learned; and the overhead
  // (AdmissionOptions::learn_ttft_overhead), in seconds.
  std::deque<std::tuple<double, TtftForecast, double>> ttft_samples;
  double ttft_overhead = 0;
};

struct AdmissionController::PrefillEval {
  bool eligible = false;
  int stage = kStagePassed;
  double backlog_tokens = 0;
  double ttft = kInf;     // Including the transfer and the calibration.
  double scale = 1;       // The calibration's factor.
  TtftForecast forecast;  // `ttft` is forecast.At(scale) + overhead.
  double overhead = 0;    // TtftOverhead of the worker.
  double transfer = 0;    // Part of forecast.request_work.
  double retry = -1;      // Seconds until it would pass; < 0 unknown.
  int64_t tokens = 0;     // Prompt tokens it computes (PrefillTokens).
};

struct AdmissionController::DecodeEval {
  bool eligible = false;
  int stage = kStagePassed;
  // Forecast at T, excluding this request.
  double batch = 0;
  double context_tokens = 0;
  double free_blocks = 0;
  double min_tpot_target = kInf;
  // Prediction including this request, and the calibration's factor in it.
  double tpot = kInf;
  double tpot_scale = 1;
  double slack = -kInf;
};

AdmissionController::AdmissionController(AdmissionOptions options, QosConfig qos,
                                         const Clock* clock)
    : options_(std::move(options)),
      qos_(std::move(qos)),
      clock_(clock),
      origin_(clock->Now()),
      transfer_(options_.transfer_model) {
  TRIDENT_CHECK(options_.kv_block_size_tokens > 0);
  TRIDENT_CHECK(options_.slo_margin > 0);
  TRIDENT_CHECK(!qos_.classes.empty());
}

AdmissionController::~AdmissionController() = default;

double AdmissionController::NowSeconds() const {
  return absl::ToDoubleSeconds(clock_->Now() - origin_);
}

absl::Status AdmissionController::UpdateLoad(const WorkerLoadReport& report) {
  if (report.worker_id.empty()) {
    return absl::InvalidArgumentError("WorkerLoadReport.worker_id: must not be empty");
  }
  if (report.running_sequences < 0 || report.waiting_sequences < 0 ||
      report.queued_prefill_tokens < 0 || report.batch_context_tokens < 0 ||
      report.kv_blocks_free < 0 || report.kv_blocks_free > report.kv_blocks_total ||
      !(report.prefill_tokens_per_second >= 0) || report.decode_step_time < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WorkerLoadReport of ", report.worker_id,
        ": counts must not be negative and kv_blocks_free must not exceed kv_blocks_total"));
  }
  const double now = NowSeconds();
  absl::MutexLock lock(&mu_);
  auto it = worker_index_.find(report.worker_id);
  int index;
  if (it == worker_index_.end()) {
    index = static_cast<int>(workers_.size());
    workers_.push_back(std::make_unique<Worker>(report.worker_id, options_, qos_.classes.size()));
    worker_index_.emplace(report.worker_id, index);
    prefill_scratch_.resize(workers_.size());
    decode_scratch_.resize(workers_.size());
  } else {
    index = it->second;
  }
  Worker& worker = *workers_[index];
  worker.present = true;
  worker.has_report = true;
  worker.report = report;
  worker.received = now;
  // The report's queue now holds every prompt admitted before it.
  ++worker.report_seq;
  worker.tokens_since_report = 0;
  worker.requests_since_report = 0;
  worker.released_sequences = 0;
  worker.released_context_tokens = 0;
  worker.released_blocks = 0;
  if (report.running_sequences > 0 && report.decode_step_time > absl::ZeroDuration()) {
    worker.decode_model.AddSample(report.running_sequences, report.batch_context_tokens,
                                  report.decode_step_time);
  }
  worker.prefill_model.SetReportedThroughput(report.prefill_tokens_per_second);
  return absl::OkStatus();
}

void AdmissionController::RemoveWorker(absl::string_view worker_id) {
  absl::MutexLock lock(&mu_);
  auto it = worker_index_.find(worker_id);
  if (it == worker_index_.end()) return;
  Worker& worker = *workers_[it->second];
  worker.present = false;
  worker.has_report = false;
}

void AdmissionController::ObservePrefill(absl::string_view worker_id, int64_t tokens,
                                         absl::Duration compute_time) {
  absl::MutexLock lock(&mu_);
  auto it = worker_index_.find(worker_id);
  if (it == worker_index_.end()) return;
  workers_[it->second]->prefill_model.AddSample(tokens, compute_time);
}

void AdmissionController::ObserveTransfer(int64_t bytes, absl::Duration transfer_time) {
  absl::MutexLock lock(&mu_);
  transfer_.Observe(bytes, transfer_time);
}

int AdmissionController::num_in_flight() const {
  absl::MutexLock lock(&mu_);
  return num_in_flight_;
}

absl::optional<WorkerModelSnapshot> AdmissionController::ModelsOf(
    absl::string_view worker_id) const {
  absl::MutexLock lock(&mu_);
  auto it = worker_index_.find(worker_id);
  if (it == worker_index_.end()) return absl::nullopt;
  const Worker& worker = *workers_[it->second];
  WorkerModelSnapshot snapshot;
  const double now = NowSeconds();
  snapshot.ttft_scale = std::clamp(worker.ttft_calibration.QuantileAt(now, 1),
                                   options_.min_calibration_scale, options_.max_calibration_scale);
  snapshot.ttft_overhead = absl::Seconds(TtftOverhead(worker));
  snapshot.tpot_scale = std::clamp(worker.tpot_calibration.QuantileAt(now, 1),
                                   options_.min_calibration_scale, options_.max_calibration_scale);
  snapshot.prefill_fixed_seconds = worker.prefill_model.fixed_seconds();
  snapshot.prefill_seconds_per_token = worker.prefill_model.seconds_per_token();
  snapshot.decode_fixed_seconds = worker.decode_model.fixed_seconds();
  snapshot.decode_seconds_per_sequence = worker.decode_model.seconds_per_sequence();
  snapshot.decode_seconds_per_context_token = worker.decode_model.seconds_per_context_token();
  return snapshot;
}

double AdmissionController::transfer_gigabytes_per_second() const {
  absl::MutexLock lock(&mu_);
  return transfer_.gigabytes_per_second();
}

bool AdmissionController::Eligible(const Worker& worker, double now) const {
  return worker.present && worker.has_report && worker.report.accepting &&
         now - worker.received <= absl::ToDoubleSeconds(options_.stale_after);
}

const DecodeModel& AdmissionController::DecodeModelOf(const Worker& worker) const {
  if (worker.decode_model.num_samples() >= kWarmDecodeSamples) return worker.decode_model;
  const DecodeModel* best = &worker.decode_model;
  for (const auto& peer : workers_) {
    if (peer->decode_model.num_samples() > best->num_samples()) best = &peer->decode_model;
  }
  return best->num_samples() >= kWarmDecodeSamples ? *best : worker.decode_model;
}

void AdmissionController::PrefillBacklog(const Worker& worker, double now, TtftForecast* forecast,
                                         double* tokens) const {
  const double a = worker.prefill_model.fixed_seconds();
  const double b = worker.prefill_model.seconds_per_token();
  const WorkerLoadReport& report = worker.report;
  // The reported queue drains from when it was received.
  forecast->reported_work = a * report.waiting_sequences + b * report.queued_prefill_tokens;
  forecast->reported_elapsed = now - worker.received;
  forecast->since_work = a * worker.requests_since_report + b * worker.tokens_since_report;
  // What this router admitted and has not seen prefilled yet, less what the
  // worker computed of it since it started on it. A report need not show
  // prompts the worker received but has not taken into its engine yet
  // (those that arrived during a step), nor the ones the step in progress
  // computes: on a worker that prefills its whole queue in one step, the
  // reported queue is empty at almost every sample, however long it is.
  forecast->own_work = a * worker.outstanding_requests + b * worker.outstanding_tokens;
  forecast->own_elapsed = now - worker.outstanding_since;
  // Tokens still queued, at the fitted rate.
  const double reported = forecast->reported_work;
  const double remaining = std::max(0.0, reported - forecast->reported_elapsed);
  *tokens = (reported > 0 ? remaining / reported : 0) * report.queued_prefill_tokens +
            worker.tokens_since_report;
  const double own = forecast->own_work;
  const double own_remaining = std::max(0.0, own - forecast->own_elapsed);
  if (own_remaining > remaining + forecast->since_work) {
    *tokens = std::max(*tokens, (own > 0 ? own_remaining / own : 0) * worker.outstanding_tokens);
  }
}

void AdmissionController::InReport(const Worker& worker, const Record& r, double now,
                                   double* sequences, double* context_tokens,
                                   double* blocks) const {
  *sequences = 0;
  *context_tokens = 0;
  *blocks = 0;
  const double block = options_.kv_block_size_tokens;
  const double start = r.prefill_done ? r.decode_start : std::max(r.decode_start, now);
  const double tpot = std::max(r.tpot, absl::ToDoubleSeconds(worker.report.decode_step_time));
  // Ties count as not yet reported: the conservative side for blocks.
  if (r.prefill_done && start < worker.received) {
    // Running when the report was sampled: part of its batch and blocks.
    const double generated =
        std::clamp((worker.received - start) / tpot, 0.0, double(r.max_output_tokens));
    *sequences = 1;
    *context_tokens = r.prompt_tokens + generated;
    *blocks = std::ceil((r.prompt_tokens + generated) / block);
  } else if (r.admitted < worker.received) {
    // Its prompt's reservation existed when the report was sampled.
    *blocks = std::ceil(r.prompt_tokens / block);
  }
}

void AdmissionController::ForecastDecode(const Worker& worker, double now, double t,
                                         DecodeEval* eval) const {
  const WorkerLoadReport& report = worker.report;
  const double reported_step = absl::ToDoubleSeconds(report.decode_step_time);
  double known_in_report = 0;
  double known_in_report_context = 0;
  double future_blocks = 0;
  double batch = 0;
  double context = 0;
  double min_target = kInf;
  for (uint32_t slot : worker.decode_records) {
    const Record& r = records_[slot];
    // Not yet marked done: decoding from its predicted start, or from now if
    // that passed already.
    const double start = r.prefill_done ? r.decode_start : std::max(r.decode_start, now);
    // Sequences slow down as the batch grows after their admission; the
    // worker's current step time bounds their TPOT from below.
    const double tpot = std::max(r.tpot, reported_step);
    const double finish = start + r.max_output_tokens * tpot;
    double sequences_in_report, context_in_report, blocks_in_report;
    InReport(worker, r, now, &sequences_in_report, &context_in_report, &blocks_in_report);
    known_in_report += sequences_in_report;
    known_in_report_context += context_in_report;
    future_blocks += std::max(0.0, r.blocks - blocks_in_report);
    if (finish > t) {
      batch += 1;
      context += r.prompt_tokens + std::clamp((t - start) / tpot, 0.0, double(r.max_output_tokens));
      min_target = std::min(min_target, r.tpot_target);
    }
  }
  // Sequences the report counts that this router did not admit (or lost):
  // assumed to keep running.
  batch += std::max(0.0, report.running_sequences - known_in_report - worker.released_sequences);
  context += std::max(
      0.0, report.batch_context_tokens - known_in_report_context - worker.released_context_tokens);
  eval->batch = batch;
  eval->context_tokens = context;
  eval->free_blocks = report.kv_blocks_free + worker.released_blocks - future_blocks;
  eval->min_tpot_target = min_target;
}

double AdmissionController::UnusedReservedByOthers(const std::vector<int64_t>& used_by_class,
                                                   double capacity, int klass) const {
  double unused = 0;
  for (size_t c = 0; c < qos_.classes.size(); ++c) {
    if (static_cast<int>(c) == klass) continue;
    unused += std::max(0.0, qos_.classes[c].reserved_fraction * capacity - used_by_class[c]);
  }
  return unused;
}

double AdmissionController::DecodeWaitSeconds(const Worker& worker, const DecodeEval& eval,
                                              double now, double t, int64_t prompt_tokens,
                                              int64_t need_blocks, int klass, double tpot_limit) {
  const double reported_step = absl::ToDoubleSeconds(worker.report.decode_step_time);
  finish_scratch_.clear();
  for (uint32_t slot : worker.decode_records) {
    const Record& r = records_[slot];
    const double start = r.prefill_done ? r.decode_start : std::max(r.decode_start, now);
    const double tpot = std::max(r.tpot, reported_step);
    const double finish = start + r.max_output_tokens * tpot;
    if (finish > t) finish_scratch_.emplace_back(finish, slot);
  }
  std::sort(finish_scratch_.begin(), finish_scratch_.end());
  // Take the counted sequences out of the forecast at T one by one, earliest
  // finish first, until this request would pass: then it may retry once that
  // sequence is predicted done, i.e. (finish - T) from now.
  class_scratch_.assign(worker.class_kv_blocks.begin(), worker.class_kv_blocks.end());
  double batch = eval.batch;
  double context = eval.context_tokens;
  double free_blocks = eval.free_blocks;
  const double capacity = worker.report.kv_blocks_total;
  const DecodeModel& model = DecodeModelOf(worker);
  for (const auto& [finish, slot] : finish_scratch_) {
    const Record& r = records_[slot];
    const double start = r.prefill_done ? r.decode_start : std::max(r.decode_start, now);
    const double tpot = std::max(r.tpot, reported_step);
    batch -= 1;
    context -= r.prompt_tokens + std::clamp((t - start) / tpot, 0.0, double(r.max_output_tokens));
    free_blocks += r.blocks;
    class_scratch_[r.klass] -= r.blocks;
    const bool kv_ok =
        free_blocks - UnusedReservedByOthers(class_scratch_, capacity, klass) >= need_blocks;
    const bool tpot_ok =
        eval.tpot_scale *
            model.PredictSeconds(static_cast<int64_t>(std::max(batch, 0.0)) + 1,
                                 static_cast<int64_t>(std::max(context, 0.0)) + prompt_tokens) <=
        tpot_limit;
    if (kv_ok && tpot_ok) return finish - t;
  }
  return -1;
}

double AdmissionController::TtftOverhead(const Worker& worker) const {
  return options_.learn_ttft_overhead ? worker.ttft_overhead : 0;
}

double AdmissionController::FitTtftOverhead(const Worker& worker, double now) const {
  // measured = overhead + slope * predicted, least squares over the recent
  // samples; only where their predictions differ enough to tell a fixed
  // cost from a factor (else none: a factor it is, as without learning).
  const double max_age = absl::ToDoubleSeconds(options_.calibration_max_age);
  double n = 0, sx = 0, sy = 0;
  for (const auto& [when, forecast, measured] : worker.ttft_samples) {
    if (now - when > max_age) continue;
    n += 1;
    sx += forecast.At(1);
    sy += measured;
  }
  if (n < 8) return 0;
  const double mx = sx / n, my = sy / n;
  double sxx = 0, sxy = 0;
  for (const auto& [when, forecast, measured] : worker.ttft_samples) {
    if (now - when > max_age) continue;
    const double dx = forecast.At(1) - mx;
    sxx += dx * dx;
    sxy += dx * (measured - my);
  }
  // A coefficient of variation of the predictions below 0.5: alike.
  if (!(sxx > 0.25 * mx * mx * n)) return 0;
  const double slope = sxy / sxx;
  if (!(slope > 0)) return 0;
  return std::clamp(my - slope * mx, 0.0, absl::ToDoubleSeconds(options_.max_ttft_overhead));
}

double AdmissionController::TtftScale(Worker& worker, double now) {
  double scale = worker.ttft_calibration.Quantile(now, 1);
  // The oldest prompt still waiting here has a TTFT of at least its age: a
  // lower bound on its ratio, known before it ends (a stalled or slowed
  // worker shows here at once, not one request later).
  while (!worker.outstanding.empty()) {
    const auto [slot, generation] = worker.outstanding.front();
    const Record& r = records_[slot];
    if (r.in_use && r.generation == generation && !r.prefill_done) break;
    worker.outstanding.pop_front();
  }
  if (!worker.outstanding.empty()) {
    const Record& oldest = records_[worker.outstanding.front().first];
    if (oldest.ttft_forecast.request_work > 0) {
      scale = std::max(scale,
                       oldest.ttft_forecast.ScaleFor(now - oldest.admitted - TtftOverhead(worker)));
    }
  }
  return std::clamp(scale, options_.min_calibration_scale, options_.max_calibration_scale);
}

double AdmissionController::TpotScale(Worker& worker, double now) {
  return std::clamp(worker.tpot_calibration.Quantile(now, 1), options_.min_calibration_scale,
                    options_.max_calibration_scale);
}

void AdmissionController::ObserveTtft(AdmissionId id, absl::Duration ttft) {
  const double now = NowSeconds();
  absl::MutexLock lock(&mu_);
  Record* r = FindRecord(id);
  if (r == nullptr || r->ttft_observed || !(r->ttft_forecast.request_work > 0)) return;
  r->ttft_observed = true;
  Worker& worker = *workers_[r->prefill];
  const double measured = absl::ToDoubleSeconds(ttft);
  if (!options_.learn_ttft_overhead) {
    worker.ttft_calibration.Add(now, r->ttft_forecast.ScaleFor(measured));
    return;
  }
  worker.ttft_samples.emplace_back(now, r->ttft_forecast, measured);
  while (static_cast<int>(worker.ttft_samples.size()) > std::max(1, options_.calibration_window)) {
    worker.ttft_samples.pop_front();
  }
  worker.ttft_overhead = FitTtftOverhead(worker, now);
  // Every factor again, against the overhead as now learned (a factor
  // taken before the overhead was known would overprice for the window).
  const double overhead = TtftOverhead(worker);
  worker.ttft_calibration.Clear();
  for (const auto& [when, forecast, value] : worker.ttft_samples) {
    worker.ttft_calibration.Add(when, forecast.ScaleFor(value - overhead));
  }
}

void AdmissionController::ObserveTpot(AdmissionId id, absl::Duration tpot) {
  const double now = NowSeconds();
  absl::MutexLock lock(&mu_);
  Record* r = FindRecord(id);
  if (r == nullptr || r->tpot_observed || !(r->raw_tpot > 0)) return;
  r->tpot_observed = true;
  workers_[r->decode]->tpot_calibration.Add(now, absl::ToDoubleSeconds(tpot) / r->raw_tpot);
}

absl::Duration AdmissionController::ClampRetry(double seconds) const {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return options_.default_retry_after;
  return std::clamp(absl::Seconds(seconds), options_.min_retry_after, options_.max_retry_after);
}

AdmissionController::Record* AdmissionController::FindRecord(AdmissionId id) {
  const uint32_t slot = static_cast<uint32_t>(id & 0xffffffffu);
  const uint32_t generation = static_cast<uint32_t>(id >> 32);
  if (slot >= records_.size()) return nullptr;
  Record& record = records_[slot];
  if (!record.in_use || record.generation != generation) return nullptr;
  return &record;
}

AdmissionId AdmissionController::AddRecord(const AdmissionRequest& request, int klass, int prefill,
                                           int decode, double now, double decode_start,
                                           double tpot_seconds, double tpot_target,
                                           int64_t need_blocks, const TtftForecast& ttft_forecast,
                                           double raw_tpot) {
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<uint32_t>(records_.size());
    records_.emplace_back();
  }
  Record& r = records_[slot];
  r.in_use = true;
  r.prefill_done = false;
  r.prefill = prefill;
  r.decode = decode;
  r.klass = klass;
  r.prompt_tokens = request.prompt_tokens;
  r.prefill_tokens = PrefillTokens(request, *workers_[prefill]);
  r.max_output_tokens = request.max_output_tokens;
  r.blocks = need_blocks;
  r.admitted = now;
  r.decode_start = decode_start;
  r.tpot = tpot_seconds;
  r.tpot_target = tpot_target;
  r.ttft_forecast = ttft_forecast;
  r.raw_tpot = raw_tpot;
  r.ttft_observed = false;
  r.tpot_observed = false;

  Worker& p = *workers_[prefill];
  r.prefill_report_seq = p.report_seq;
  if (p.outstanding_requests == 0) p.outstanding_since = now;
  p.outstanding_requests += 1;
  p.outstanding_tokens += r.prefill_tokens;
  p.outstanding.emplace_back(slot, r.generation);
  p.tokens_since_report += r.prefill_tokens;
  p.requests_since_report += 1;
  p.class_prefill_tokens[klass] += r.prefill_tokens;

  Worker& d = *workers_[decode];
  r.decode_pos = static_cast<uint32_t>(d.decode_records.size());
  d.decode_records.push_back(slot);
  d.class_kv_blocks[klass] += need_blocks;
  ++num_in_flight_;
  return (static_cast<uint64_t>(r.generation) << 32) | slot;
}

void AdmissionController::EndPrefill(Record& r, double now) {
  Worker& p = *workers_[r.prefill];
  p.outstanding_requests -= 1;
  p.outstanding_tokens -= r.prefill_tokens;
  p.outstanding_since = now;
  if (r.prefill_report_seq == p.report_seq) {
    p.tokens_since_report -= r.prefill_tokens;
    p.requests_since_report -= 1;
  }
  p.class_prefill_tokens[r.klass] -= r.prefill_tokens;
  r.prefill_done = true;
}

void AdmissionController::MarkPrefillDone(AdmissionId id) {
  const double now = NowSeconds();
  absl::MutexLock lock(&mu_);
  Record* r = FindRecord(id);
  if (r == nullptr || r->prefill_done) return;
  EndPrefill(*r, now);
  r->decode_start = now;
}

void AdmissionController::Release(AdmissionId id) {
  const double now = NowSeconds();
  absl::MutexLock lock(&mu_);
  Record* r = FindRecord(id);
  if (r == nullptr) return;
  if (!r->prefill_done) EndPrefill(*r, now);
  Worker& d = *workers_[r->decode];
  // What the decode worker's last report still counts of it is free now.
  double sequences, context_tokens, blocks;
  InReport(d, *r, now, &sequences, &context_tokens, &blocks);
  d.released_sequences += sequences;
  d.released_context_tokens += context_tokens;
  d.released_blocks += blocks;
  const uint32_t slot = d.decode_records[r->decode_pos];
  const uint32_t moved = d.decode_records.back();
  d.decode_records[r->decode_pos] = moved;
  records_[moved].decode_pos = r->decode_pos;
  d.decode_records.pop_back();
  d.class_kv_blocks[r->klass] -= r->blocks;
  r->in_use = false;
  ++r->generation;
  if (r->generation == 0) r->generation = 1;  // Ids are never 0.
  free_slots_.push_back(slot);
  --num_in_flight_;
}

namespace {

absl::Status ValidateAdmissionRequest(const AdmissionRequest& request) {
  if (request.prompt_tokens <= 0) {
    return absl::InvalidArgumentError("AdmissionRequest.prompt_tokens: must be positive");
  }
  if (request.max_output_tokens <= 0) {
    return absl::InvalidArgumentError("AdmissionRequest.max_output_tokens: must be positive");
  }
  if (request.ttft.has_value() && *request.ttft <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("AdmissionRequest.ttft: must be positive");
  }
  if (request.tpot.has_value() && *request.tpot <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("AdmissionRequest.tpot: must be positive");
  }
  return absl::OkStatus();
}

}  // namespace

// What one Admit call weighs, resolved once.
struct AdmissionController::AdmitScope {
  const AdmissionRequest& request;
  int klass = 0;
  double ttft_target = kInf;
  double tpot_target = kInf;
  double margin = 1;
  int64_t n = 0;  // Prompt tokens.
  int64_t need_blocks = 0;
  double queue_capacity = 0;
  double now = 0;
  double transfer = 0;  // Predicted KV transfer seconds.
};

absl::StatusOr<AdmissionDecision> AdmissionController::Admit(const AdmissionRequest& request) {
  TRIDENT_RETURN_IF_ERROR(ValidateAdmissionRequest(request));
  const int klass = qos_.Find(request.qos_class);
  if (klass < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdmissionRequest.qos_class: unknown class \"", request.qos_class, "\""));
  }
  const QosClass& qos = qos_.classes[klass];
  AdmitScope scope{.request = request, .klass = klass};
  scope.ttft_target = ToSeconds(request.ttft.has_value() ? request.ttft : qos.default_ttft);
  scope.tpot_target = ToSeconds(request.tpot.has_value() ? request.tpot : qos.default_tpot);
  scope.margin = options_.slo_margin;
  scope.n = request.prompt_tokens;
  scope.need_blocks =
      CeilDiv(request.prompt_tokens + request.max_output_tokens, options_.kv_block_size_tokens);
  scope.queue_capacity = static_cast<double>(options_.prefill_queue_capacity_tokens);

  AdmissionDecision decision;
  decision.qos_class_index = klass;
  if (options_.enabled) {
    decision.ttft_target = request.ttft.has_value() ? request.ttft : qos.default_ttft;
  }
  scope.now = NowSeconds();
  absl::MutexLock lock(&mu_);
  scope.transfer = transfer_.PredictSeconds(TransferTokens(request, scope.now));

  double best_pass_ttft = kInf;
  double best_any_ttft = kInf;
  const int num_prefill = EvaluatePrefill(scope, &best_pass_ttft, &best_any_ttft);
  // Decode candidates are forecast at T: when this request would join a
  // batch.
  const double t = scope.now + (std::isfinite(best_pass_ttft) ? best_pass_ttft : best_any_ttft);
  int best_decode = -1;
  int decode_stage = kStagePassed;
  const int num_decode = EvaluateDecode(scope, t, &best_decode, &decode_stage);
  if (num_prefill == 0 || num_decode == 0) {
    decision.reason = RejectReason::kNoWorkers;
    decision.retry_after = options_.default_retry_after;
    return decision;
  }
  if (!options_.enabled || request.must_admit) return AdmitLeastLoaded(scope, decision);

  decision.predicted_ttft = ToDuration(best_any_ttft);
  if (best_decode < 0) {
    RejectOnDecode(scope, t, decode_stage, &decision);
    return decision;
  }
  decision.predicted_tpot = ToDuration(decode_scratch_[best_decode].tpot);
  ChoosePrefill(scope, best_decode, &decision);
  return decision;
}

bool AdmissionController::Pairable(int prefill, int decode) const {
  // A worker without a KV transport serves both halves of a request itself.
  return prefill == decode ||
         (!workers_[prefill]->report.colocated_only && !workers_[decode]->report.colocated_only);
}

TtftForecast AdmissionController::ForecastFor(const PrefillEval& e, bool colocated) {
  // No transfer when the prefill worker is the decode worker itself.
  TtftForecast forecast = e.forecast;
  if (colocated) forecast.request_work -= e.transfer;
  return forecast;
}

int64_t AdmissionController::PrefillTokens(const AdmissionRequest& request, const Worker& worker) {
  int64_t cached = 0;
  if (auto it = request.cached_tokens.find(worker.id); it != request.cached_tokens.end()) {
    cached += it->second;
  }
  if (auto it = request.dram_cached_tokens.find(worker.id);
      it != request.dram_cached_tokens.end()) {
    cached += it->second;
  }
  return request.prompt_tokens - std::clamp<int64_t>(cached, 0, request.prompt_tokens - 1);
}

int64_t AdmissionController::TransferTokens(const AdmissionRequest& request, double now) const {
  int64_t held = 0;
  for (const auto& worker : workers_) {
    if (worker->report.role == WorkerRole::kPrefill || !Eligible(*worker, now)) continue;
    auto it = request.cached_tokens.find(worker->id);
    if (it != request.cached_tokens.end()) held = std::max(held, it->second);
  }
  return request.prompt_tokens - std::clamp<int64_t>(held, 0, request.prompt_tokens - 1);
}

int AdmissionController::EvaluatePrefill(const AdmitScope& s, double* best_pass_ttft,
                                         double* best_any_ttft) {
  int num_prefill = 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = *workers_[i];
    PrefillEval& e = prefill_scratch_[i];
    e = PrefillEval();
    if (w.report.role == WorkerRole::kDecode || !Eligible(w, s.now) ||
        s.request.excluded_workers.contains(w.id)) {
      continue;
    }
    e.eligible = true;
    ++num_prefill;
    PrefillBacklog(w, s.now, &e.forecast, &e.backlog_tokens);
    e.transfer = s.transfer;
    e.tokens = PrefillTokens(s.request, w);
    e.forecast.request_work = w.prefill_model.PredictSeconds(e.tokens) + s.transfer;
    e.scale = TtftScale(w, s.now);
    e.overhead = TtftOverhead(w);
    e.ttft = e.forecast.At(e.scale) + e.overhead;
    *best_any_ttft = std::min(*best_any_ttft, e.ttft);
    const double b = w.prefill_model.seconds_per_token();
    const double queued = e.backlog_tokens + static_cast<double>(e.tokens);
    const double class_room = s.queue_capacity - UnusedReservedByOthers(w.class_prefill_tokens,
                                                                        s.queue_capacity, s.klass);
    if (queued > s.queue_capacity) {
      e.stage = kStageTtft;
      e.retry = (queued - s.queue_capacity) * b;
    } else if (queued > class_room) {
      e.stage = kStagePrefillClass;
      e.retry = (queued - class_room) * b;
    } else if (e.ttft > s.ttft_target * s.margin) {
      e.stage = kStageTtft;
      e.retry = e.ttft - s.ttft_target * s.margin;
    } else {
      *best_pass_ttft = std::min(*best_pass_ttft, e.ttft);
    }
  }
  return num_prefill;
}

int AdmissionController::EvaluateDecode(const AdmitScope& s, double t, int* best_decode,
                                        int* decode_stage) {
  int num_decode = 0;
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& w = *workers_[i];
    DecodeEval& e = decode_scratch_[i];
    e = DecodeEval();
    if (w.report.role == WorkerRole::kPrefill || !Eligible(w, s.now) ||
        s.request.excluded_workers.contains(w.id)) {
      continue;
    }
    e.eligible = true;
    ++num_decode;
    ForecastDecode(w, s.now, t, &e);
    e.tpot_scale = TpotScale(w, s.now);
    e.tpot = e.tpot_scale *
             DecodeModelOf(w).PredictSeconds(static_cast<int64_t>(e.batch) + 1,
                                             static_cast<int64_t>(e.context_tokens) + s.n);
    const double limit = std::min(s.tpot_target, e.min_tpot_target) * s.margin;
    e.slack = limit - e.tpot;
    const double kv_total = w.report.kv_blocks_total;
    if (e.free_blocks < s.need_blocks) {
      e.stage = kStageKv;
    } else if (e.free_blocks - UnusedReservedByOthers(w.class_kv_blocks, kv_total, s.klass) <
               s.need_blocks) {
      e.stage = kStageDecodeClass;
    } else if (e.tpot > limit) {
      e.stage = kStageTpot;
    }
    if (e.stage != kStagePassed) {
      *decode_stage = std::max(*decode_stage, e.stage);
      continue;
    }
    if (*best_decode < 0) {
      *best_decode = static_cast<int>(i);
      continue;
    }
    const DecodeEval& best = decode_scratch_[*best_decode];
    // Most slack first; with no target (infinite slack), the fastest.
    if (e.slack > best.slack || (e.slack == best.slack && e.tpot < best.tpot)) {
      *best_decode = static_cast<int>(i);
    }
  }
  return num_decode;
}

AdmissionDecision AdmissionController::AdmitLeastLoaded(const AdmitScope& s,
                                                        AdmissionDecision decision) {
  // Admission off: the least-loaded pair, whatever the predictions.
  int decode = -1;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const DecodeEval& e = decode_scratch_[i];
    if (!e.eligible) continue;
    if (decode < 0 || e.batch < decode_scratch_[decode].batch ||
        (e.batch == decode_scratch_[decode].batch &&
         e.free_blocks > decode_scratch_[decode].free_blocks)) {
      decode = static_cast<int>(i);
    }
  }
  int prefill = -1;
  double ttft = kInf;
  TtftForecast forecast;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const PrefillEval& e = prefill_scratch_[i];
    if (!e.eligible || !Pairable(static_cast<int>(i), decode)) continue;
    const TtftForecast forecast_i = ForecastFor(e, static_cast<int>(i) == decode);
    const double ttft_i = forecast_i.At(e.scale) + e.overhead;
    if (prefill < 0 || ttft_i < ttft) {
      prefill = static_cast<int>(i);
      ttft = ttft_i;
      forecast = forecast_i;
    }
  }
  if (prefill < 0) {
    // The least-loaded decode worker has no KV transport and cannot prefill.
    decision.reason = RejectReason::kNoWorkers;
    decision.retry_after = options_.default_retry_after;
    return decision;
  }
  const DecodeEval& d = decode_scratch_[decode];
  const double tpot = d.tpot;
  decision.admitted = true;
  decision.id = AddRecord(s.request, s.klass, prefill, decode, s.now, s.now + ttft, tpot,
                          s.tpot_target, s.need_blocks, forecast, tpot / d.tpot_scale);
  decision.prefill_worker_id = workers_[prefill]->id;
  decision.decode_worker_id = workers_[decode]->id;
  decision.colocated = prefill == decode && workers_[decode]->report.colocated_only;
  decision.predicted_cached_tokens =
      s.request.prompt_tokens - PrefillTokens(s.request, *workers_[prefill]);
  decision.predicted_ttft = ToDuration(ttft);
  decision.predicted_tpot = ToDuration(tpot);
  return decision;
}

void AdmissionController::RejectOnDecode(const AdmitScope& s, double t, int decode_stage,
                                         AdmissionDecision* decision) {
  // Early rejection on the decode side, before any prefill is spent.
  double best_tpot = kInf;
  double wait = kInf;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const DecodeEval& e = decode_scratch_[i];
    if (!e.eligible) continue;
    best_tpot = std::min(best_tpot, e.tpot);
    const double limit = std::min(s.tpot_target, e.min_tpot_target) * s.margin;
    const double w =
        DecodeWaitSeconds(*workers_[i], e, s.now, t, s.n, s.need_blocks, s.klass, limit);
    if (w >= 0) wait = std::min(wait, w);
  }
  decision->reason = decode_stage == kStageKv            ? RejectReason::kKvCapacity
                     : decode_stage == kStageDecodeClass ? RejectReason::kClassCapacity
                                                         : RejectReason::kTpot;
  decision->retry_after = ClampRetry(wait);
  decision->predicted_tpot = ToDuration(best_tpot);
}

void AdmissionController::ChoosePrefill(const AdmitScope& s, int best_decode,
                                        AdmissionDecision* decision) {
  // The prefill worker with the least TTFT among those meeting it, with no
  // transfer when it is the decode worker itself.
  int best_prefill = -1;
  double best_ttft = kInf;
  TtftForecast best_forecast;
  int prefill_stage = kStagePassed;
  double wait = kInf;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const PrefillEval& e = prefill_scratch_[i];
    if (!e.eligible || !Pairable(static_cast<int>(i), best_decode)) continue;
    int stage = e.stage;
    double ttft = e.ttft;
    double retry = e.retry;
    const TtftForecast forecast = ForecastFor(e, static_cast<int>(i) == best_decode);
    if (static_cast<int>(i) == best_decode) {
      ttft = forecast.At(e.scale) + e.overhead;
      if (stage == kStageTtft &&
          e.backlog_tokens + static_cast<double>(e.tokens) <= s.queue_capacity) {
        stage = ttft > s.ttft_target * s.margin ? kStageTtft : kStagePassed;
        retry = ttft - s.ttft_target * s.margin;
      }
    }
    if (stage != kStagePassed) {
      prefill_stage = std::max(prefill_stage, stage);
      wait = std::min(wait, retry);
      continue;
    }
    if (ttft < best_ttft) {
      best_ttft = ttft;
      best_forecast = forecast;
      best_prefill = static_cast<int>(i);
    }
  }
  if (best_prefill < 0) {
    decision->reason =
        prefill_stage == kStagePrefillClass ? RejectReason::kClassCapacity : RejectReason::kTtft;
    decision->retry_after = ClampRetry(wait);
    return;
  }
  decision->admitted = true;
  const DecodeEval& chosen = decode_scratch_[best_decode];
  decision->id = AddRecord(s.request, s.klass, best_prefill, best_decode, s.now, s.now + best_ttft,
                           chosen.tpot, s.tpot_target, s.need_blocks, best_forecast,
                           chosen.tpot / chosen.tpot_scale);
  decision->prefill_worker_id = workers_[best_prefill]->id;
  decision->decode_worker_id = workers_[best_decode]->id;
  decision->colocated = best_prefill == best_decode && workers_[best_decode]->report.colocated_only;
  decision->predicted_ttft = ToDuration(best_ttft);
  decision->predicted_cached_tokens =
      s.request.prompt_tokens - PrefillTokens(s.request, *workers_[best_prefill]);
}

}  // namespace trident::router::admission
