#include "kernels/cpu/paged_attention/paged_attention_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/numeric/dtype.h"

namespace trident::kernels::cpu {

float ReadCachedElement(const PagedKv& kv, const int32_t* block_table, int32_t pos, int32_t head,
                        int32_t dim, bool value) {
  const int64_t elem =
      static_cast<int64_t>(block_table[pos / kv.block_size]) * kv.block_stride_elems +
      (value ? kv.value_offset_elems : 0) +
      (static_cast<int64_t>(head) * kv.block_size + pos % kv.block_size) * kv.head_dim + dim;
  if (kv.dtype == numeric::DType::kF32) return static_cast<const float*>(kv.base)[elem];
  return numeric::Bf16ToFloat(static_cast<const uint16_t*>(kv.base)[elem]);
}

void PagedAttentionReference(const PagedKv& kv, const float* q, int64_t q_stride,
                             int32_t num_q_heads, absl::Span<const AttentionSequence> seqs,
                             float scale, float* out, int64_t out_stride) {
  const int32_t d = kv.head_dim;
  const int32_t group = num_q_heads / kv.num_kv_heads;
  for (const AttentionSequence& seq : seqs) {
    // Gather: keys[pos][head][dim], values likewise.
    const int64_t per_pos = static_cast<int64_t>(kv.num_kv_heads) * d;
    std::vector<double> keys(seq.context_len * per_pos);
    std::vector<double> values(seq.context_len * per_pos);
    for (int32_t p = 0; p < seq.context_len; ++p) {
      for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
        for (int32_t i = 0; i < d; ++i) {
          keys[p * per_pos + h * d + i] = ReadCachedElement(kv, seq.block_table, p, h, i, false);
          values[p * per_pos + h * d + i] = ReadCachedElement(kv, seq.block_table, p, h, i, true);
        }
      }
    }
    for (int32_t j = 0; j < seq.query_len; ++j) {
      const int32_t pos = seq.context_len - seq.query_len + j;
      const int64_t row = seq.query_row + j;
      for (int32_t h = 0; h < num_q_heads; ++h) {
        const int32_t g = h / group;
        const float* qh = q + row * q_stride + static_cast<int64_t>(h) * d;
        std::vector<double> weights(pos + 1);
        double max_score = -INFINITY;
        for (int32_t t = 0; t <= pos; ++t) {
          double dot = 0.0;
          for (int32_t i = 0; i < d; ++i) dot += qh[i] * keys[t * per_pos + g * d + i];
          weights[t] = dot * scale;
          max_score = std::max(max_score, weights[t]);
        }
        double total = 0.0;
        for (double& w : weights) total += (w = std::exp(w - max_score));
        float* o = out + row * out_stride + static_cast<int64_t>(h) * d;
        for (int32_t i = 0; i < d; ++i) {
          double sum = 0.0;
          for (int32_t t = 0; t <= pos; ++t) sum += weights[t] * values[t * per_pos + g * d + i];
          o[i] = static_cast<float>(sum / total);
        }
      }
    }
  }
}

}  // namespace trident::kernels::cpu
