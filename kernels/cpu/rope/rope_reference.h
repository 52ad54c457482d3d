// The executable spec for RoPE (rope.h): a line-by-line transcription of
// Hugging Face's float32 code, one "tensor op" per loop, for tests only.
//
//   inv_freq  = 1.0 / (base ** (arange(0, d, 2).float() / d))
//   (llama3)  wavelen = 2 * pi / inv_freq; ... torch.where(...)
//   emb       = cat(freqs, freqs); cos = emb.cos(); sin = emb.sin()
//   q_embed   = (q * cos) + (rotate_half(q) * sin)

#ifndef TRIDENT_KERNELS_CPU_ROPE_ROPE_REFERENCE_H_
#define TRIDENT_KERNELS_CPU_ROPE_ROPE_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "kernels/cpu/rope/rope.h"

namespace trident::kernels::cpu {

// Same contract as RopeInvFreq.
std::vector<float> RopeInvFreqReference(const RopeConfig& config);

// Same contract as ApplyRope.
void ApplyRopeReference(float* q, int64_t q_token_stride, int32_t num_q_heads, float* k,
                        int64_t k_token_stride, int32_t num_kv_heads, int32_t head_dim,
                        const int32_t* positions, int64_t num_tokens, const float* inv_freq);

}  // namespace trident::kernels::cpu

#endif  // TRIDENT_KERNELS_CPU_ROPE_ROPE_REFERENCE_H_
