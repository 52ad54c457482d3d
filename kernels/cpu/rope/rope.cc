#include "kernels/cpu/rope/rope.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cpu/target_clones.h"

// This file is built with -ffp-contract=off: every product below is rounded
// on its own, as torch's separate elementwise ops round it.

namespace trident::kernels::cpu {
namespace {

// Below this many rotated elements a parallel region costs more than it saves.
constexpr int64_t kMinParallelElements = 1 << 14;

TRIDENT_TARGET_CLONES void RotateHead(
    float* x, const float* cos_f, const float* sin_f, int32_t half) {
  float* x2 = x + half;
#pragma omp simd
  for (int32_t i = 0; i < half; ++i) {
    const float a = x[i];
    const float b = x2[i];
    x[i] = a * cos_f[i] - b * sin_f[i];
    x2[i] = b * cos_f[i] + a * sin_f[i];
  }
}

}  // namespace

absl::Status ValidateRopeConfig(const RopeConfig& config) {
  if (config.head_dim <= 0 || config.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope: head_dim is ", config.head_dim, "; want a positive even number"));
  }
  if (!(config.theta > 0.0) || !std::isfinite(config.theta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope: rope_theta is ", config.theta, "; want a positive finite number"));
  }
  if (!config.llama3_scaling) return absl::OkStatus();
  if (!(config.factor > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope: rope_scaling.factor is ", config.factor, "; want > 0"));
  }
  if (!(config.low_freq_factor > 0.0f) || !(config.high_freq_factor > config.low_freq_factor)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope: rope_scaling.low_freq_factor ", config.low_freq_factor, " and high_freq_factor ",
        config.high_freq_factor, "; want 0 < low_freq_factor < high_freq_factor"));
  }
  if (config.original_max_position_embeddings <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope: rope_scaling.original_max_position_embeddings is ",
                     config.original_max_position_embeddings, "; want > 0"));
  }
  return absl::OkStatus();
}

std::vector<float> RopeInvFreq(const RopeConfig& config) {
  const int32_t half = config.head_dim / 2;
  std::vector<float> inv_freq(half);
  // torch casts the Python-float base to the tensor's float32 before pow.
  const float base = static_cast<float>(config.theta);
  for (int32_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(config.head_dim);
    const float power = static_cast<float>(std::pow(static_cast<double>(base), exponent));
    inv_freq[i] = 1.0f / power;
  }
  if (!config.llama3_scaling) return inv_freq;

  // Python scalars meet float32 tensors: the scalar is cast to float32, and
  // `scalar / tensor` is torch's `tensor.reciprocal() * scalar`.
  const double old_context_len = config.original_max_position_embeddings;
  const float low_freq_wavelen = static_cast<float>(old_context_len / config.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(old_context_len / config.high_freq_factor);
  const float two_pi = static_cast<float>(2 * M_PI);
  const float factor = config.factor;
  const float smooth_denominator =
      static_cast<float>(static_cast<double>(config.high_freq_factor) - config.low_freq_factor);
  for (int32_t i = 0; i < half; ++i) {
    const float inv = inv_freq[i];
    const float wavelen = (1.0f / inv) * two_pi;
    if (wavelen > low_freq_wavelen) {
      inv_freq[i] = inv / factor;
    } else if (!(wavelen < high_freq_wavelen)) {
      const float smooth =
          ((1.0f / wavelen) * static_cast<float>(old_context_len) - config.low_freq_factor) /
          smooth_denominator;
      inv_freq[i] = (1.0f - smooth) * inv / factor + smooth * inv;
    }
  }
  return inv_freq;
}

void ApplyRope(float* q, int64_t q_token_stride, int32_t num_q_heads, float* k,
               int64_t k_token_stride, int32_t num_kv_heads, int32_t head_dim,
               const int32_t* positions, int64_t num_tokens, const float* inv_freq) {
  const int32_t half = head_dim / 2;
  const int64_t work = num_tokens * (num_q_heads + num_kv_heads) * head_dim;
#pragma omp parallel if (num_tokens > 1 && work >= kMinParallelElements)
  {
    std::vector<float> cos_f(half);
    std::vector<float> sin_f(half);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
      const float position = static_cast<float>(positions[t]);
      for (int32_t i = 0; i < half; ++i) {
        const float angle = position * inv_freq[i];
        cos_f[i] = std::cos(angle);
        sin_f[i] = std::sin(angle);
      }
      for (int32_t h = 0; h < num_q_heads; ++h) {
        RotateHead(q + t * q_token_stride + h * head_dim, cos_f.data(), sin_f.data(), half);
      }
      for (int32_t h = 0; h < num_kv_heads; ++h) {
        RotateHead(k + t * k_token_stride + h * head_dim, cos_f.data(), sin_f.data(), half);
      }
    }
  }
}

}  // namespace trident::kernels::cpu
