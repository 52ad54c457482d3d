// AdmissionController's forecasts of a worker: its prefill backlog, its
// decode batch at a time to come, and how long until a request would fit.

#include <algorithm>
#include <cmath>

#include "services/router/admission/admission_controller.h"
#include "services/router/admission/admission_controller_state.h"

namespace trident::router::admission {

using admission_internal::kInf;

bool AdmissionController::Eligible(const Worker& worker, double now) const {
  return worker.present && worker.has_report && worker.report.accepting &&
         now - worker.received <= absl::ToDoubleSeconds(options_.stale_after);
}

bool AdmissionController::DecodeModelFresh(const Worker& worker, double now) const {
  return worker.decode_model.num_samples() >= kWarmDecodeSamples &&
         now - worker.decode_sampled <= absl::ToDoubleSeconds(options_.calibration_max_age);
}

const DecodeModel& AdmissionController::DecodeModelOf(const Worker& worker, double now) const {
  if (DecodeModelFresh(worker, now)) return worker.decode_model;
  const DecodeModel* fresh = nullptr;
  const DecodeModel* sampled = &worker.decode_model;
  for (const auto& peer : workers_) {
    const DecodeModel& model = peer->decode_model;
    if (peer.get() != &worker && DecodeModelFresh(*peer, now) &&
        (fresh == nullptr || model.num_samples() > fresh->num_samples())) {
      fresh = &model;
    }
    if (model.num_samples() > sampled->num_samples()) sampled = &model;
  }
  if (fresh != nullptr) return *fresh;
  return sampled->num_samples() >= kWarmDecodeSamples ? *sampled : worker.decode_model;
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
  const DecodeModel& model = DecodeModelOf(worker, now);
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

}  // namespace trident::router::admission
