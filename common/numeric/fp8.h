// FP8 E4M3 (the OCP "fn" format of NVIDIA's __nv_fp8_e4m3: 1 sign, 4
// exponent bits with bias 7, 3 mantissa bits; no infinities; S.1111.111 is
// NaN; the largest finite value is 448, the smallest subnormal 2^-9), the
// element format of an FP8 KV cache. Values are stored divided by a scale
// (one per KV head and layer), so that the head's largest magnitude maps
// near 448. These are the reference conversions the GPU kernels are tested
// against.

#ifndef TRIDENT_COMMON_NUMERIC_FP8_H_
#define TRIDENT_COMMON_NUMERIC_FP8_H_

#include <cstdint>

#include "absl/types/span.h"

namespace trident::numeric {

inline constexpr float kFp8E4M3Max = 448.0f;
inline constexpr uint8_t kFp8E4M3NaN = 0x7f;

// Rounds to the nearest representable value (ties to even), saturating
// finite values and infinities beyond +-448 to +-448; NaN gives kFp8E4M3NaN.
// This is the saturating conversion (__NV_SATFINITE) a KV cache wants: an
// outlier past its head's scale is clipped, never turned into NaN.
uint8_t FloatToFp8E4M3(float f);

// The exact value of `bits` (NaN for 0x7f and 0xff).
float Fp8E4M3ToFloat(uint8_t bits);

// The scale that maps the largest magnitude of `values` to kFp8E4M3Max
// (values are stored as FloatToFp8E4M3(v / scale)); 1 for an empty or
// all-zero span, or one holding an infinity (nothing finite to fit). NaNs
// are ignored.
float Fp8E4M3Scale(absl::Span<const float> values);

}  // namespace trident::numeric

#endif  // TRIDENT_COMMON_NUMERIC_FP8_H_
