#include "kernels/cpu/rms_norm/rms_norm_reference.h"

#include <cmath>
#include <cstdint>

namespace trident::kernels::cpu {

void RmsNormReference(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                      float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(row[i]) * row[i];
    const double scale = 1.0 / std::sqrt(sum / static_cast<double>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) {
      out[r * dim + i] = static_cast<float>(static_cast<double>(weight[i]) * row[i] * scale);
    }
  }
}

void AddRmsNormReference(float* residual, const float* delta, const float* weight, int64_t rows,
                         int64_t dim, float eps, float* out) {
  for (int64_t i = 0; i < rows * dim; ++i) residual[i] += delta[i];
  RmsNormReference(residual, weight, rows, dim, eps, out);
}

}  // namespace trident::kernels::cpu
