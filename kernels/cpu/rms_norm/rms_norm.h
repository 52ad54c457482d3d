// RMSNorm as in Hugging Face's LlamaRMSNorm, in fp32:
//
//   variance = mean(x[r, :]^2)                      (fp32)
//   out[r, i] = weight[i] * (x[r, i] * rsqrt(variance + eps))
//
// AddRmsNorm fuses the residual add in front of it, as every decoder layer
// does between attention and MLP:
//
//   residual[r, :] = residual[r, :] + delta[r, :]   (the new hidden state)
//   out[r, :]      = RmsNorm(residual[r, :])
//
// Rows are contiguous (stride `dim`). Rows are spread over the calling
// thread's OpenMP threads when there is enough work; the inner loop is
// vectorized for the CPU it runs on (AVX-512, AVX2 or baseline).

#ifndef TRIDENT_KERNELS_CPU_RMS_NORM_RMS_NORM_H_
#define TRIDENT_KERNELS_CPU_RMS_NORM_RMS_NORM_H_

#include <cstdint>

namespace trident::kernels::cpu {

// REQUIRES: x and out hold rows * dim floats, weight dim; dim > 0 when
// rows > 0. `out` may equal `x` (in place); otherwise they do not overlap.
void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out);

// REQUIRES: residual, delta and out hold rows * dim floats, weight dim.
// `out` may equal `delta` but not `residual`; nothing else overlaps.
void AddRmsNorm(float* residual, const float* delta, const float* weight, int64_t rows, int64_t dim,
                float eps, float* out);

}  // namespace trident::kernels::cpu

#endif  // TRIDENT_KERNELS_CPU_RMS_NORM_RMS_NORM_H_
