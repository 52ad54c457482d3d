// The executable spec for RmsNorm and AddRmsNorm (rms_norm.h): plain loops
// with the sum of squares and the scaling in double, rounded to float once.
// For tests only.

#ifndef TRIDENT_KERNELS_CPU_RMS_NORM_RMS_NORM_REFERENCE_H_
#define TRIDENT_KERNELS_CPU_RMS_NORM_RMS_NORM_REFERENCE_H_

#include <cstdint>

namespace trident::kernels::cpu {

// Same contract as RmsNorm.
void RmsNormReference(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                      float* out);

// Same contract as AddRmsNorm; the residual sum is rounded to float (as the
// stored hidden state is) before it is normalized.
void AddRmsNormReference(float* residual, const float* delta, const float* weight, int64_t rows,
                         int64_t dim, float eps, float* out);

}  // namespace trident::kernels::cpu

#endif  // TRIDENT_KERNELS_CPU_RMS_NORM_RMS_NORM_REFERENCE_H_
