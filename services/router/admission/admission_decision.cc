// AdmissionController::Admit: the candidates' evaluation and the decision.

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "services/router/admission/admission_controller.h"
#include "services/router/admission/admission_controller_state.h"

namespace trident::router::admission {

using admission_internal::CeilDiv;
using admission_internal::kInf;
using admission_internal::kStageDecodeClass;
using admission_internal::kStageKv;
using admission_internal::kStagePassed;
using admission_internal::kStagePrefillClass;
using admission_internal::kStageTpot;
using admission_internal::kStageTtft;
using admission_internal::ToDuration;
using admission_internal::ToSeconds;

absl::Duration AdmissionController::ClampRetry(double seconds) const {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return options_.default_retry_after;
  return std::clamp(absl::Seconds(seconds), options_.min_retry_after, options_.max_retry_after);
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
  } else {
    decision.predicted_tpot = ToDuration(decode_scratch_[best_decode].tpot);
    ChoosePrefill(scope, best_decode, &decision);
  }
  if (!decision.admitted &&
      (decision.reason == RejectReason::kTtft || decision.reason == RejectReason::kTpot)) {
    AdmitIdleProbe(scope, &decision);
  }
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
             DecodeModelOf(w, s.now).PredictSeconds(static_cast<int64_t>(e.batch) + 1,
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
  AdmitPair(s, prefill, decode, ttft, forecast, &decision);
  return decision;
}

void AdmissionController::AdmitPair(const AdmitScope& s, int prefill, int decode, double ttft,
                                    const TtftForecast& forecast, AdmissionDecision* decision) {
  const DecodeEval& d = decode_scratch_[decode];
  decision->admitted = true;
  decision->id = AddRecord(s.request, s.klass, prefill, decode, s.now, s.now + ttft, d.tpot,
                           s.tpot_target, s.need_blocks, forecast, d.tpot / d.tpot_scale);
  decision->prefill_worker_id = workers_[prefill]->id;
  decision->decode_worker_id = workers_[decode]->id;
  decision->colocated = prefill == decode && workers_[decode]->report.colocated_only;
  decision->predicted_cached_tokens =
      s.request.prompt_tokens - PrefillTokens(s.request, *workers_[prefill]);
  decision->predicted_ttft = ToDuration(ttft);
  decision->predicted_tpot = ToDuration(d.tpot);
}

bool AdmissionController::IdleForProbe(const Worker& prefill, const Worker& decode,
                                       const DecodeEval& d, double now) const {
  // Nothing of this router's in flight on either, nothing in their last
  // reports, room for the request's KV, and no probe on the prefill worker
  // for an interval.
  return prefill.outstanding_requests == 0 && prefill.requests_since_report == 0 &&
         prefill.report.waiting_sequences == 0 && prefill.report.queued_prefill_tokens == 0 &&
         now - prefill.last_probe >= absl::ToDoubleSeconds(options_.idle_probe_interval) &&
         decode.decode_records.empty() && decode.report.running_sequences == 0 &&
         (d.stage == kStagePassed || d.stage == kStageTpot);
}

void AdmissionController::AdmitIdleProbe(const AdmitScope& s, AdmissionDecision* decision) {
  if (options_.idle_probe_interval <= absl::ZeroDuration()) return;
  for (size_t d = 0; d < workers_.size(); ++d) {
    if (!decode_scratch_[d].eligible) continue;
    for (size_t p = 0; p < workers_.size(); ++p) {
      const PrefillEval& e = prefill_scratch_[p];
      if (!e.eligible || !Pairable(static_cast<int>(p), static_cast<int>(d)) ||
          !IdleForProbe(*workers_[p], *workers_[d], decode_scratch_[d], s.now)) {
        continue;
      }
      const TtftForecast forecast = ForecastFor(e, p == d);
      // Admitted: the rejection's reason and retry time no longer apply.
      decision->reason = AdmissionDecision().reason;
      decision->retry_after = absl::ZeroDuration();
      AdmitPair(s, static_cast<int>(p), static_cast<int>(d), forecast.At(e.scale) + e.overhead,
                forecast, decision);
      decision->probe = true;
      workers_[p]->last_probe = s.now;
      return;
    }
  }
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
  AdmitPair(s, best_prefill, best_decode, best_ttft, best_forecast, decision);
}

}  // namespace trident::router::admission
