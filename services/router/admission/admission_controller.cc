// AdmissionController's bookkeeping: worker reports and removals, records
// of admitted requests from admission to release, and the calibration of
// its forecasts by observed TTFT and TPOT. Forecasts are in
// admission_forecast.cc, Admit's decision in admission_decision.cc.

#include "services/router/admission/admission_controller.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/status/error_details.h"
#include "services/router/admission/admission_controller_state.h"

namespace trident::router::admission {

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
    worker.decode_sampled = now;
  }
  worker.prefill_model.SetReportedThroughput(report.prefill_tokens_per_second);
  RefreshTtftFit(worker, now);
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

double AdmissionController::TtftOverhead(const Worker& worker) const {
  return options_.learn_ttft_overhead ? worker.ttft_overhead : 0;
}

double AdmissionController::FitTtftOverhead(const Worker& worker) const {
  // measured = overhead + slope * predicted, least squares over the samples
  // of prompts admitted to an idle worker (TtftSample::idle); only where
  // their predictions differ enough to tell a fixed cost from a factor
  // (else none: a factor it is, as without learning).
  double n = 0, sx = 0, sy = 0;
  for (const Worker::TtftSample& t : worker.ttft_samples) {
    if (!t.idle) continue;
    n += 1;
    sx += t.forecast.At(1);
    sy += t.measured;
  }
  if (n < 8) return 0;
  const double mx = sx / n, my = sy / n;
  double sxx = 0, sxy = 0;
  for (const Worker::TtftSample& t : worker.ttft_samples) {
    if (!t.idle) continue;
    const double dx = t.forecast.At(1) - mx;
    sxx += dx * dx;
    sxy += dx * (t.measured - my);
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
  // Nothing predicted ahead of it (At(1) is its own work alone).
  const bool idle = r->ttft_forecast.At(1) <= r->ttft_forecast.request_work * (1 + 1e-9);
  worker.ttft_samples.push_back(
      {.when = now, .forecast = r->ttft_forecast, .measured = measured, .idle = idle});
  while (static_cast<int>(worker.ttft_samples.size()) > std::max(1, options_.calibration_window)) {
    worker.ttft_samples.pop_front();
  }
  RefitTtft(worker, now);
}

void AdmissionController::RefitTtft(Worker& worker, double now) {
  const double max_age = absl::ToDoubleSeconds(options_.calibration_max_age);
  while (!worker.ttft_samples.empty() && now - worker.ttft_samples.front().when > max_age) {
    worker.ttft_samples.pop_front();
  }
  worker.ttft_overhead = FitTtftOverhead(worker);
  // Every factor again, against the overhead as now learned (a factor
  // taken before the overhead was known would overprice for the window).
  const double overhead = TtftOverhead(worker);
  worker.ttft_calibration.Clear();
  for (const Worker::TtftSample& t : worker.ttft_samples) {
    worker.ttft_calibration.Add(t.when, t.forecast.ScaleFor(t.measured - overhead));
  }
  worker.ttft_fit_expires = worker.ttft_samples.empty()
                                ? admission_internal::kInf
                                : worker.ttft_samples.front().when + max_age;
}

void AdmissionController::RefreshTtftFit(Worker& worker, double now) {
  if (options_.learn_ttft_overhead && now > worker.ttft_fit_expires) RefitTtft(worker, now);
}

void AdmissionController::ObserveTpot(AdmissionId id, absl::Duration tpot) {
  const double now = NowSeconds();
  absl::MutexLock lock(&mu_);
  Record* r = FindRecord(id);
  if (r == nullptr || r->tpot_observed || !(r->raw_tpot > 0)) return;
  r->tpot_observed = true;
  workers_[r->decode]->tpot_calibration.Add(now, absl::ToDoubleSeconds(tpot) / r->raw_tpot);
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

}  // namespace trident::router::admission
