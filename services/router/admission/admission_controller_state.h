// Internal to the admission package: the state behind AdmissionController
// (its records, its view of each worker, a candidate's evaluation) and the
// helpers its files share. admission_controller.cc keeps the bookkeeping
// and calibration, admission_forecast.cc forecasts a worker's prefill queue
// and decode batch, admission_decision.cc makes Admit's decision.
// Not thread-safe on its own: every member is guarded by the controller's
// mutex.

#ifndef TRIDENT_SERVICES_ROUTER_ADMISSION_ADMISSION_CONTROLLER_STATE_H_
#define TRIDENT_SERVICES_ROUTER_ADMISSION_ADMISSION_CONTROLLER_STATE_H_

#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "services/router/admission/admission_controller.h"
#include "services/router/admission/rolling_quantile.h"

namespace trident::router::admission {
namespace admission_internal {

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

inline absl::Duration ToDuration(double seconds) {
  return std::isfinite(seconds) ? absl::Seconds(seconds) : absl::InfiniteDuration();
}

inline double ToSeconds(const absl::optional<absl::Duration>& d) {
  return d.has_value() ? absl::ToDoubleSeconds(*d) : kInf;
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace admission_internal

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
  // The request's TPOT target; admission_internal::kInf if none.
  double tpot_target = admission_internal::kInf;
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
  // When decode_model last took a sample (a report of running sequences
  // and a decode step time).
  double decode_sampled = -admission_internal::kInf;
  // Prefill side: prompts admitted since the last report (not in its queue).
  int64_t tokens_since_report = 0;
  int64_t requests_since_report = 0;
  // Prompt tokens admitted and not yet prefilled, per class.
  std::vector<int64_t> class_prefill_tokens;
  // Prompts admitted here and not yet prefilled, whatever the reports say,
  // and since when the worker has been computing them (the admission that
  // found it idle of ours, or its last prefill of ours that ended).
  int64_t outstanding_requests = 0;
  // When a request was last admitted here as an idle probe.
  double last_probe = -admission_internal::kInf;
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
  // The outcomes behind ttft_calibration, so that its factors follow the
  // overhead as it is learned; and the overhead
  // (AdmissionOptions::learn_ttft_overhead), in seconds.
  struct TtftSample {
    double when = 0;
    TtftForecast forecast;
    double measured = 0;
    // Admitted with nothing predicted ahead of it on the worker: what such
    // a prompt takes beyond its own work is the fixed overhead alone. A
    // prompt behind a queue adds what the queue's forecast missed (a burst's
    // contention), which fitted as an "overhead" would price every later
    // request, the idle worker's included.
    bool idle = false;
  };
  std::deque<TtftSample> ttft_samples;
  double ttft_overhead = 0;
  // When the oldest of those samples ages out (calibration_max_age), and
  // the overhead and factors fitted from them must be fitted again: learned
  // under a burst, they would otherwise price every request on an idle
  // worker as the burst's, reject it, and so never see the outcome that
  // corrects them.
  double ttft_fit_expires = admission_internal::kInf;
};

struct AdmissionController::PrefillEval {
  bool eligible = false;
  int stage = admission_internal::kStagePassed;
  double backlog_tokens = 0;
  double ttft = admission_internal::kInf;  // Including the transfer and the calibration.
  double scale = 1;                        // The calibration's factor.
  TtftForecast forecast;                   // `ttft` is forecast.At(scale) + overhead.
  double overhead = 0;                     // TtftOverhead of the worker.
  double transfer = 0;                     // Part of forecast.request_work.
  double retry = -1;                       // Seconds until it would pass; < 0 unknown.
  int64_t tokens = 0;                      // Prompt tokens it computes (PrefillTokens).
};

struct AdmissionController::DecodeEval {
  bool eligible = false;
  int stage = admission_internal::kStagePassed;
  // Forecast at T, excluding this request.
  double batch = 0;
  double context_tokens = 0;
  double free_blocks = 0;
  double min_tpot_target = admission_internal::kInf;
  // Prediction including this request, and the calibration's factor in it.
  double tpot = admission_internal::kInf;
  double tpot_scale = 1;
  double slack = -admission_internal::kInf;
};

}  // namespace trident::router::admission

#endif  // TRIDENT_SERVICES_ROUTER_ADMISSION_ADMISSION_CONTROLLER_STATE_H_
