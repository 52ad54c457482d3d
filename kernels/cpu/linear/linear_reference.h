// The executable spec for Linear (linear.h): a naive triple loop accumulating
// in double. For tests only.

#ifndef TRIDENT_KERNELS_CPU_LINEAR_LINEAR_REFERENCE_H_
#define TRIDENT_KERNELS_CPU_LINEAR_LINEAR_REFERENCE_H_

#include <cstdint>

#include "common/numeric/dtype.h"

namespace trident::kernels::cpu {

// y[r, o] = sum_i x[r, i] * W[o, i] (+ bias[o]), W [out_features][in_features]
// of `weight_dtype` (kF32 or kBF16 bits), summed in double and rounded once.
// `bias` may be null.
void LinearReference(const float* x, int64_t m, int64_t in_features, int64_t out_features,
                     numeric::DType weight_dtype, const void* weight, const float* bias, float* y);

}  // namespace trident::kernels::cpu

#endif  // TRIDENT_KERNELS_CPU_LINEAR_LINEAR_REFERENCE_H_
