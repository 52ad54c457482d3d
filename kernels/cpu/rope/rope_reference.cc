#include "kernels/cpu/rope/rope_reference.h"

#include <cmath>
#include <cstdint>
#include <vector>

// Built with -ffp-contract=off, like rope.cc: one rounding per torch op.

namespace trident::kernels::cpu {
namespace {

// torch semantics of `python_scalar / tensor`: tensor.reciprocal() * scalar.
std::vector<float> ScalarDivTensor(double scalar, const std::vector<float>& t) {
  std::vector<float> out(t.size());
  for (size_t i = 0; i < t.size(); ++i) out[i] = (1.0f / t[i]) * static_cast<float>(scalar);
  return out;
}

void RotateOne(float* x, int32_t d, const std::vector<float>& cos_emb,
               const std::vector<float>& sin_emb) {
  const int32_t half = d / 2;
  std::vector<float> rotated(d);  // rotate_half(x) = cat(-x2, x1)
  for (int32_t i = 0; i < half; ++i) rotated[i] = -x[half + i];
  for (int32_t i = 0; i < half; ++i) rotated[half + i] = x[i];
  std::vector<float> x_cos(d);
  std::vector<float> rotated_sin(d);
  for (int32_t i = 0; i < d; ++i) x_cos[i] = x[i] * cos_emb[i];
  for (int32_t i = 0; i < d; ++i) rotated_sin[i] = rotated[i] * sin_emb[i];
  for (int32_t i = 0; i < d; ++i) x[i] = x_cos[i] + rotated_sin[i];
}

}  // namespace

std::vector<float> RopeInvFreqReference(const RopeConfig& config) {
  const int32_t dim = config.head_dim;
  std::vector<float> exponent;  // torch.arange(0, dim, 2, dtype=int64).float() / dim
  for (int64_t j = 0; j < dim; j += 2) {
    exponent.push_back(static_cast<float>(j) / static_cast<float>(dim));
  }
  std::vector<float> power(exponent.size());  // base ** exponent, base cast to float32
  for (size_t i = 0; i < power.size(); ++i) {
    power[i] = static_cast<float>(std::pow(static_cast<double>(static_cast<float>(config.theta)),
                                           static_cast<double>(exponent[i])));
  }
  std::vector<float> inv_freq = ScalarDivTensor(1.0, power);
  if (!config.llama3_scaling) return inv_freq;

  const double factor = config.factor;
  const double low_freq_factor = config.low_freq_factor;
  const double high_freq_factor = config.high_freq_factor;
  const double old_context_len = config.original_max_position_embeddings;
  const double low_freq_wavelen = old_context_len / low_freq_factor;
  const double high_freq_wavelen = old_context_len / high_freq_factor;

  const std::vector<float> wavelen = ScalarDivTensor(2 * M_PI, inv_freq);
  // inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
  std::vector<float> inv_freq_llama(inv_freq.size());
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    inv_freq_llama[i] = wavelen[i] > static_cast<float>(low_freq_wavelen)
                            ? inv_freq[i] / static_cast<float>(factor)
                            : inv_freq[i];
  }
  // smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high - low)
  std::vector<float> smooth_factor = ScalarDivTensor(old_context_len, wavelen);
  for (float& s : smooth_factor) s = s - static_cast<float>(low_freq_factor);
  for (float& s : smooth_factor) s = s / static_cast<float>(high_freq_factor - low_freq_factor);
  // smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
  std::vector<float> smoothed(inv_freq.size());
  for (size_t i = 0; i < smoothed.size(); ++i) {
    const float one_minus = 1.0f - smooth_factor[i];
    const float left = one_minus * inv_freq_llama[i] / static_cast<float>(factor);
    const float right = smooth_factor[i] * inv_freq_llama[i];
    smoothed[i] = left + right;
  }
  // is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
  for (size_t i = 0; i < smoothed.size(); ++i) {
    const bool is_medium = !(wavelen[i] < static_cast<float>(high_freq_wavelen)) &&
                           !(wavelen[i] > static_cast<float>(low_freq_wavelen));
    if (is_medium) inv_freq_llama[i] = smoothed[i];
  }
  return inv_freq_llama;
}

void ApplyRopeReference(float* q, int64_t q_token_stride, int32_t num_q_heads, float* k,
                        int64_t k_token_stride, int32_t num_kv_heads, int32_t head_dim,
                        const int32_t* positions, int64_t num_tokens, const float* inv_freq) {
  const int32_t half = head_dim / 2;
  for (int64_t t = 0; t < num_tokens; ++t) {
    // freqs = inv_freq @ position (one product each); emb = cat(freqs, freqs)
    std::vector<float> emb(head_dim);
    for (int32_t i = 0; i < half; ++i) {
      emb[i] = inv_freq[i] * static_cast<float>(positions[t]);
      emb[half + i] = emb[i];
    }
    std::vector<float> cos_emb(head_dim);
    std::vector<float> sin_emb(head_dim);
    for (int32_t i = 0; i < head_dim; ++i) cos_emb[i] = std::cos(emb[i]);
    for (int32_t i = 0; i < head_dim; ++i) sin_emb[i] = std::sin(emb[i]);
    for (int32_t h = 0; h < num_q_heads; ++h) {
      RotateOne(q + t * q_token_stride + h * head_dim, head_dim, cos_emb, sin_emb);
    }
    for (int32_t h = 0; h < num_kv_heads; ++h) {
      RotateOne(k + t * k_token_stride + h * head_dim, head_dim, cos_emb, sin_emb);
    }
  }
}

}  // namespace trident::kernels::cpu
