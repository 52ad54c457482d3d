#include "kernels/cpu/decode_attention/decode_attention_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/numeric/dtype.h"

namespace trident::kernels::cpu {

float ReadDecodeKvElement(const DecodeKvLayout& layout, const void* kv, int32_t token,
                          int32_t head, int32_t dim, bool value) {
  const int64_t elem = DecodeKvElementOffset(layout, token, head, dim, value);
  switch (layout.dtype) {
    case numeric::DType::kF32:
      return static_cast<const float*>(kv)[elem];
    case numeric::DType::kBF16:
      return numeric::Bf16ToFloat(static_cast<const uint16_t*>(kv)[elem]);
    case numeric::DType::kF16:
      return numeric::HalfToFloat(static_cast<const uint16_t*>(kv)[elem]);
    case numeric::DType::kFP8E4M3:
      break;  // Not a layout the CPU decode kernels take.
  }
  return 0.0f;
}

void DecodeAttentionReference(const DecodeKvLayout& layout, int32_t num_q_heads, float scale,
                              absl::Span<const DecodeSequence> seqs) {
  const int32_t d = layout.head_dim;
  const int32_t group = num_q_heads / layout.num_kv_heads;
  for (const DecodeSequence& seq : seqs) {
    // Element (t, h, j) of K or V, through the block table if there is one.
    auto read = [&](int32_t t, int32_t h, int32_t j, bool value) {
      if (seq.blocks == nullptr) return ReadDecodeKvElement(layout, seq.kv, t, h, j, value);
      return ReadDecodeKvElement(layout, seq.blocks[t / layout.block_size],
                                 t % layout.block_size, h, j, value);
    };
    for (int32_t h = 0; h < num_q_heads; ++h) {
      const int32_t kv_head = h / group;
      const float* q = seq.q + static_cast<int64_t>(h) * d;
      std::vector<double> scores(seq.context_len);
      for (int32_t t = 0; t < seq.context_len; ++t) {
        double dot = 0.0;
        for (int32_t j = 0; j < d; ++j) {
          dot += static_cast<double>(q[j]) * read(t, kv_head, j, /*value=*/false);
        }
        scores[t] = dot * scale;
      }
      const double max = *std::max_element(scores.begin(), scores.end());
      double sum = 0.0;
      for (double& s : scores) {
        s = std::exp(s - max);
        sum += s;
      }
      for (int32_t j = 0; j < d; ++j) {
        double o = 0.0;
        for (int32_t t = 0; t < seq.context_len; ++t) {
          o += scores[t] * read(t, kv_head, j, /*value=*/true);
        }
        seq.o[static_cast<int64_t>(h) * d + j] = static_cast<float>(o / sum);
      }
      if (seq.lse != nullptr) seq.lse[h] = static_cast<float>(max + std::log(sum));
    }
  }
}

}  // namespace trident::kernels::cpu
