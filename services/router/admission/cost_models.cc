#include "services/router/admission/cost_models.h"

#include <algorithm>
#include <cmath>

#include "common/logging/log.h"

namespace trident::router::admission {

PrefillModel::PrefillModel(const PrefillModelOptions& options)
    : prior_fixed_seconds_(absl::ToDoubleSeconds(options.prior_fixed_time)),
      fit_(/*num_features=*/2, options.window,
           FitPrior{.values = {prior_fixed_seconds_, 1.0 / options.prior_tokens_per_second, 0},
                    .scales = {1.0, options.token_scale, 1.0},
                    .weight = options.prior_weight,
                    .fade_samples = options.prior_fade_samples,
                    .ridge = options.ridge}) {
  TRIDENT_CHECK(options.prior_tokens_per_second > 0);
}

void PrefillModel::AddSample(int64_t tokens, absl::Duration compute_time) {
  if (tokens <= 0 || compute_time <= absl::ZeroDuration()) return;
  fit_.Add({1.0, static_cast<double>(tokens), 0}, absl::ToDoubleSeconds(compute_time));
}

void PrefillModel::SetReportedThroughput(double tokens_per_second) {
  if (!(tokens_per_second > 0) || !std::isfinite(tokens_per_second)) return;
  fit_.SetPrior({prior_fixed_seconds_, 1.0 / tokens_per_second, 0});
}

double PrefillModel::PredictSeconds(int64_t tokens) const {
  return fit_.Predict({1.0, static_cast<double>(std::max<int64_t>(tokens, 0)), 0});
}

DecodeModel::DecodeModel(const DecodeModelOptions& options)
    : fit_(/*num_features=*/3, options.window,
           FitPrior{.values = {absl::ToDoubleSeconds(options.prior_step_fixed),
                               absl::ToDoubleSeconds(options.prior_per_sequence),
                               absl::ToDoubleSeconds(options.prior_per_context_token)},
                    .scales = {1.0, options.batch_scale, options.context_scale},
                    .weight = options.prior_weight,
                    .fade_samples = options.prior_fade_samples,
                    .ridge = options.ridge}) {}

void DecodeModel::AddSample(int64_t batch, int64_t context_tokens, absl::Duration step_time) {
  if (batch <= 0 || context_tokens < 0 || step_time <= absl::ZeroDuration()) return;
  fit_.Add({1.0, static_cast<double>(batch), static_cast<double>(context_tokens)},
           absl::ToDoubleSeconds(step_time));
}

double DecodeModel::PredictSeconds(int64_t batch, int64_t context_tokens) const {
  const double t = fit_.Predict({1.0, static_cast<double>(std::max<int64_t>(batch, 0)),
                                 static_cast<double>(std::max<int64_t>(context_tokens, 0))});
  // Every coefficient is >= 0; a step is never free even if all came out 0.
  return std::max(t, 1e-6);
}

double TtftForecast::At(double scale) const {
  const double queue = std::max(0.0, scale * reported_work - reported_elapsed) + scale * since_work;
  const double own = std::max(0.0, scale * own_work - own_elapsed);
  return std::max(queue, own) + scale * request_work;
}

double TtftForecast::ScaleFor(double ttft_seconds) const {
  if (!(ttft_seconds > At(0))) return 0;
  if (At(kMaxScale) <= ttft_seconds) return kMaxScale;
  // At is piecewise linear and increasing: bisect on [0, kMaxScale].
  double lo = 0;
  double hi = kMaxScale;
  while (hi - lo > 1e-6 * hi) {
    const double mid = 0.5 * (lo + hi);
    (At(mid) < ttft_seconds ? lo : hi) = mid;
  }
  return hi;
}

int64_t KvBytesPerToken(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim,
                        int32_t bytes_per_element) {
  return int64_t{2} * num_layers * num_kv_heads * head_dim * bytes_per_element;
}

TransferModel::TransferModel(const TransferModelOptions& options)
    : bytes_per_token_(options.bytes_per_token),
      bytes_per_second_(options.prior_gigabytes_per_second * 1e9),
      latency_seconds_(absl::ToDoubleSeconds(options.fixed_latency)),
      alpha_(options.ewma_alpha) {
  TRIDENT_CHECK(bytes_per_token_ >= 0);
  TRIDENT_CHECK(bytes_per_second_ > 0);
  TRIDENT_CHECK(alpha_ > 0 && alpha_ <= 1);
}

void TransferModel::Observe(int64_t bytes, absl::Duration time) {
  const double seconds = absl::ToDoubleSeconds(time) - latency_seconds_;
  // A transfer no longer than the fixed latency says nothing about bandwidth.
  if (bytes <= 0 || !(seconds > 0)) return;
  bytes_per_second_ += alpha_ * (static_cast<double>(bytes) / seconds - bytes_per_second_);
}

double TransferModel::PredictSeconds(int64_t tokens) const {
  if (bytes_per_token_ == 0 || tokens <= 0) return 0;
  return latency_seconds_ +
         static_cast<double>(tokens) * static_cast<double>(bytes_per_token_) / bytes_per_second_;
}

}  // namespace trident::router::admission
