#include "kernels/cpu/linear/linear_reference.h"

#include <cstdint>

#include "common/numeric/dtype.h"

namespace trident::kernels::cpu {

void LinearReference(const float* x, int64_t m, int64_t in_features, int64_t out_features,
                     numeric::DType weight_dtype, const void* weight, const float* bias, float* y) {
  const bool bf16 = weight_dtype == numeric::DType::kBF16;
  const float* w32 = static_cast<const float*>(weight);
  const uint16_t* w16 = static_cast<const uint16_t*>(weight);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t o = 0; o < out_features; ++o) {
      double sum = bias != nullptr ? bias[o] : 0.0;
      for (int64_t i = 0; i < in_features; ++i) {
        const int64_t w = o * in_features + i;
        sum += static_cast<double>(x[r * in_features + i]) *
               (bf16 ? numeric::Bf16ToFloat(w16[w]) : w32[w]);
      }
      y[r * out_features + o] = static_cast<float>(sum);
    }
  }
}

}  // namespace trident::kernels::cpu
