#include "kernels/cpu/silu_mul/silu_mul.h"

#include <cmath>

namespace trident::kernels::cpu {

void SiluMulReference(const float* gate_up, float* out, int64_t num_tokens, int64_t hidden) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* gate = gate_up + t * 2 * hidden;
    const float* up = gate + hidden;
    float* row = out + t * hidden;
    for (int64_t i = 0; i < hidden; ++i) {
      const float g = gate[i];
      row[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }
}

}  // namespace trident::kernels::cpu
