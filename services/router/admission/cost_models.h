#ifndef TRIDENT_SERVICES_ROUTER_ADMISSION_COST_MODELS_H_
#define TRIDENT_SERVICES_ROUTER_ADMISSION_COST_MODELS_H_

// Cost models the router's admission uses to predict latencies, fitted from
// live measurements:
//
//   PrefillModel   per prefill worker: compute time of a prompt,
//                  t = a + b * tokens (windowed ridge least squares).
//   DecodeModel    per decode worker: duration of one decode step (the time
//                  per output token of every sequence in the batch),
//                  t = c0 + c1 * batch + c2 * context_tokens.
//   TransferModel  cluster-wide: KV transfer time of a prompt,
//                  t = latency + tokens * bytes_per_token / bandwidth, the
//                  bandwidth an exponentially weighted mean of measurements.
//
// Before enough samples exist each model answers from documented priors (the
// defaults below); see linear_fit.h for how samples and the prior combine and
// why the fits stay well conditioned. Predictions are in seconds as double on
// the hot path (no absl::Duration conversions per candidate).
//
// All classes are thread-compatible.

#include <cstddef>
#include <cstdint>

#include "absl/time/time.h"
#include "services/router/admission/linear_fit.h"

namespace trident::router::admission {

// Prior and window of a PrefillModel.
//
// Defaults: 5 ms fixed cost per prefill (launch, sampling, first-token
// return) and 10,000 tokens/s, about an 8B-parameter model's prefill on one
// modern GPU (2 * 8e9 FLOP per token at ~200 TFLOP/s effective is ~12,500
// tokens/s). The prior is worth `prior_weight` samples of `token_scale`
// tokens, fading out over `prior_fade_samples` samples (linear_fit.h). A
// worker's own reported throughput (WorkerLoad's prefill_tokens_per_second)
// replaces the prior's slope once seen.
struct PrefillModelOptions {
  absl::Duration prior_fixed_time = absl::Milliseconds(5);
  double prior_tokens_per_second = 10000;
  double prior_weight = 2;
  double prior_fade_samples = 16;
  double ridge = 0.01;
  double token_scale = 1024;
  std::size_t window = 128;
};

// Prefill compute time of one prompt on one worker: a + b * tokens.
class PrefillModel {
 public:
  // REQUIRES: options' durations and rates are positive and window >= 1.
  explicit PrefillModel(const PrefillModelOptions& options = {});

  // One measured prefill: `tokens` prompt tokens computed (cached tokens
  // excluded) in `compute_time` (first layer to first token, not queueing).
  // Samples with tokens <= 0 or a non-positive time are ignored.
  void AddSample(int64_t tokens, absl::Duration compute_time);

  // A throughput the worker measured itself. Moves the prior's per-token
  // slope to 1 / tokens_per_second; ignored unless positive and finite.
  void SetReportedThroughput(double tokens_per_second);

  // Predicted compute time of `tokens` prompt tokens, in seconds (>= 0).
  double PredictSeconds(int64_t tokens) const;

  // The fitted a (seconds) and b (seconds per token).
  double fixed_seconds() const { return fit_.coefficients()[0]; }
  double seconds_per_token() const { return fit_.coefficients()[1]; }
  std::size_t num_samples() const { return fit_.num_samples(); }

 private:
  double prior_fixed_seconds_;
  WindowedRidgeFit fit_;
};

// Prior and window of a DecodeModel.
//
// Defaults, again for an 8B-class model on one modern GPU: 8 ms per step
// fixed (reading 16 GB of bf16 weights at ~4.8 TB/s is ~3.4 ms, plus launch
// and sampling overheads), 0.1 ms per sequence in the batch, 30 ns per
// context token (Llama-3-8B's KV is 128 KiB per token; reading it at
// ~4.8 TB/s takes ~27 ns). The prior is worth `prior_weight` samples at
// `batch_scale` sequences and `context_scale` tokens, fading out over
// `prior_fade_samples` samples; `ridge` stays, for conditioning. Load reports
// often move batch and context together, so the ridge (centred on the
// prior) is what keeps their split defined.
struct DecodeModelOptions {
  absl::Duration prior_step_fixed = absl::Milliseconds(8);
  absl::Duration prior_per_sequence = absl::Microseconds(100);
  absl::Duration prior_per_context_token = absl::Nanoseconds(30);
  double prior_weight = 2;
  double prior_fade_samples = 32;
  double ridge = 0.01;
  double batch_scale = 32;
  double context_scale = 32768;
  std::size_t window = 256;
};

// Decode step time of one worker: c0 + c1 * batch + c2 * context_tokens,
// where `batch` is the number of sequences in the step and `context_tokens`
// the sum of their context lengths.
class DecodeModel {
 public:
  // REQUIRES: options' durations are non-negative, scales positive, window
  // >= 1.
  explicit DecodeModel(const DecodeModelOptions& options = {});

  // One observed step (or a short mean of steps at a stable batch). Ignored
  // when batch <= 0, context_tokens < 0 or the time is not positive.
  void AddSample(int64_t batch, int64_t context_tokens, absl::Duration step_time);

  // Predicted step time in seconds (> 0 for batch >= 1).
  double PredictSeconds(int64_t batch, int64_t context_tokens) const;

  double fixed_seconds() const { return fit_.coefficients()[0]; }
  double seconds_per_sequence() const { return fit_.coefficients()[1]; }
  double seconds_per_context_token() const { return fit_.coefficients()[2]; }
  std::size_t num_samples() const { return fit_.num_samples(); }

 private:
  WindowedRidgeFit fit_;
};

// The time to first token of a prompt on one prefill worker, as a function of
// how much slower the worker runs than its fitted PrefillModel (`scale`, 1 at
// the fitted rate). Work is in seconds at the fitted rate; elapsed times are
// wall time the worker has already spent on that work. A slowed worker has
// done less of its backlog than the elapsed time suggests, so the scale
// multiplies work before elapsed time is taken off it, not after:
//
//   At(s) = max(max(0, s * reported_work - reported_elapsed) + s * since_work,
//               max(0, s * own_work - own_elapsed))
//           + s * request_work
//
// (two views of the backlog, the larger taken: the worker's last report
// drained since it arrived plus prompts admitted after it, and the prompts
// this router admitted and has not seen prefilled drained since the worker
// started on them). At(1) is the uncalibrated prediction. At is continuous
// and increasing in s, so an outcome (a measured TTFT, or a lower bound such
// as the age of a prompt still waiting) implies the scale ScaleFor(ttft):
// the calibration collects those. Value type.
struct TtftForecast {
  double reported_work = 0;
  double reported_elapsed = 0;
  double since_work = 0;
  double own_work = 0;
  double own_elapsed = 0;
  // This prompt's prefill and KV transfer.
  double request_work = 0;

  // Predicted TTFT in seconds at `scale` (>= 0).
  double At(double scale) const;
  // The scale s >= 0 with At(s) == ttft_seconds, to within 1e-6 relative;
  // 0 when ttft_seconds <= At(0), and kMaxScale when At(kMaxScale) is still
  // below it. REQUIRES: request_work > 0 (else At is flat and no scale is
  // implied; callers skip such forecasts).
  double ScaleFor(double ttft_seconds) const;

  static constexpr double kMaxScale = 1024;
};

// KV bytes one token occupies: keys and values of every layer.
// REQUIRES: all arguments >= 0.
int64_t KvBytesPerToken(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim,
                        int32_t bytes_per_element);

// Prior and smoothing of a TransferModel.
struct TransferModelOptions {
  // KV bytes per prompt token (KvBytesPerToken of the served model's layout).
  // 0 means transfers are free (colocated or unknown).
  int64_t bytes_per_token = 0;
  // Link bandwidth assumed before the first measurement: 10 GB/s, a
  // conservative figure for RDMA between GPUs of different hosts (NVLink and
  // cuda_ipc within a host reach far more).
  double prior_gigabytes_per_second = 10;
  // Cost of a transfer independent of its size (handshake, CommitKv round
  // trip).
  absl::Duration fixed_latency = absl::Milliseconds(1);
  // Weight of each new bandwidth measurement in the mean, in (0, 1].
  double ewma_alpha = 0.2;
};

// KV transfer time of a prompt from a prefill to a decode worker.
class TransferModel {
 public:
  // REQUIRES: bytes_per_token >= 0, prior bandwidth > 0, alpha in (0, 1].
  explicit TransferModel(const TransferModelOptions& options = {});

  // One finished transfer of `bytes` that took `time` (first write posted to
  // CommitKv returning). Ignored unless bytes > 0 and time > fixed latency.
  void Observe(int64_t bytes, absl::Duration time);

  // Predicted transfer time of `tokens` tokens' KV, in seconds.
  double PredictSeconds(int64_t tokens) const;

  double gigabytes_per_second() const { return bytes_per_second_ / 1e9; }
  int64_t bytes_per_token() const { return bytes_per_token_; }

 private:
  int64_t bytes_per_token_;
  double bytes_per_second_;
  double latency_seconds_;
  double alpha_;
};

}  // namespace trident::router::admission

#endif  // TRIDENT_SERVICES_ROUTER_ADMISSION_COST_MODELS_H_
