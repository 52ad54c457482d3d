// Rotary position embeddings as Hugging Face's Llama implementation computes
// them in fp32, including Llama 3's frequency scaling.
//
// Frequencies (`RopeInvFreq`), as `_compute_default_rope_parameters` and
// `_compute_llama3_parameters` compute them in float32:
//
//   inv_freq[i] = 1 / theta^(float(2i) / head_dim)         i in [0, head_dim / 2)
//
// Rotation (`ApplyRope`), HF's rotate_half convention: element i pairs with
// element i + head_dim/2 of the same head,
//
//   f = float(position) * inv_freq[i]       (fp32)
//   x'[i]          = x[i] * cos(f) - x[i + d/2] * sin(f)
//   x'[i + d/2]    = x[i + d/2] * cos(f) + x[i] * sin(f)
//
// with each product rounded separately (no fused multiply-add), as the
// separate torch ops do. cos and sin are computed per token from the exact fp32
// angle, so results do not depend on any table size.

#ifndef TRIDENT_KERNELS_CPU_ROPE_ROPE_H_
#define TRIDENT_KERNELS_CPU_ROPE_ROPE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace trident::kernels::cpu {

// Fields of config.json: `head_dim` (or hidden_size / num_attention_heads),
// `rope_theta`, and `rope_scaling` with rope_type "llama3".
struct RopeConfig {
  int32_t head_dim = 0;
  double theta = 10000.0;
  bool llama3_scaling = false;
  // Used only with `llama3_scaling`.
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int32_t original_max_position_embeddings = 8192;
};

// OK, or kInvalidArgument naming the offending config.json field: head_dim must
// be positive and even, rope_theta positive and finite, and with Llama 3
// scaling factor > 0, 0 < low_freq_factor < high_freq_factor and
// original_max_position_embeddings > 0.
absl::Status ValidateRopeConfig(const RopeConfig& config);

// The head_dim / 2 inverse frequencies, bit-for-bit as HF computes them except
// that pow is glibc's (correctly rounded in all but rare cases) where torch
// uses SLEEF's (within 1 ulp): the two can differ by one ulp.
// REQUIRES: ValidateRopeConfig(config).ok().
std::vector<float> RopeInvFreq(const RopeConfig& config);

// Rotates, in place, every q head and every k head of `num_tokens` tokens:
//
//   q + t * q_token_stride + h * head_dim   head h (< num_q_heads) of token t
//   k + t * k_token_stride + h * head_dim   head h (< num_kv_heads) of token t
//
// at position `positions[t]`, with `inv_freq` from RopeInvFreq (head_dim / 2
// values). Tokens are spread over the calling thread's OpenMP threads.
// REQUIRES: head_dim even; strides >= heads * head_dim; positions in
// [0, 2^24) (exact as float); `k` may be null when num_kv_heads == 0.
void ApplyRope(float* q, int64_t q_token_stride, int32_t num_q_heads, float* k,
               int64_t k_token_stride, int32_t num_kv_heads, int32_t head_dim,
               const int32_t* positions, int64_t num_tokens, const float* inv_freq);

}  // namespace trident::kernels::cpu

#endif  // TRIDENT_KERNELS_CPU_ROPE_ROPE_H_
