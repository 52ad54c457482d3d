#include "kernels/cpu/rms_norm/rms_norm.h"

#include <cmath>
#include <cstdint>

#include "common/cpu/target_clones.h"

namespace trident::kernels::cpu {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kMinParallelElements = 1 << 15;

// The sum of squares uses vector-wide partial sums (as torch's reduction does);
// the scaling is two separate roundings, x * r first, then weight *, as in HF.
TRIDENT_TARGET_CLONES void NormalizeRow(
    const float* x, const float* weight, int64_t dim, float eps, float* out) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < dim; ++i) sum += x[i] * x[i];
  const float variance = sum / static_cast<float>(dim);
  const float r = 1.0f / std::sqrt(variance + eps);
#pragma omp simd
  for (int64_t i = 0; i < dim; ++i) out[i] = weight[i] * (x[i] * r);
}

TRIDENT_TARGET_CLONES void AddRow(
    float* residual, const float* delta, int64_t dim) {
#pragma omp simd
  for (int64_t i = 0; i < dim; ++i) residual[i] = residual[i] + delta[i];
}

}  // namespace

void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
             float* out) {
#pragma omp parallel for schedule(static) if (rows > 1 && rows * dim >= kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    NormalizeRow(x + r * dim, weight, dim, eps, out + r * dim);
  }
}

void AddRmsNorm(float* residual, const float* delta, const float* weight, int64_t rows, int64_t dim,
                float eps, float* out) {
#pragma omp parallel for schedule(static) if (rows > 1 && rows * dim >= kMinParallelElements)
  for (int64_t r = 0; r < rows; ++r) {
    AddRow(residual + r * dim, delta + r * dim, dim);
    NormalizeRow(residual + r * dim, weight, dim, eps, out + r * dim);
  }
}

}  // namespace trident::kernels::cpu
