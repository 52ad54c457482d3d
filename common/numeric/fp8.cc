#include "common/numeric/fp8.h"

#include <cmath>
#include <cstring>

namespace trident::numeric {

uint8_t FloatToFp8E4M3(float f) {
  if (std::isnan(f)) return kFp8E4M3NaN;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a >= kFp8E4M3Max) return sign | 0x7e;  // Saturated (448 = S.1111.110).
  // Below 2^-6 the format is subnormal: multiples of 2^-9. Above, each
  // binade [2^e, 2^(e+1)) holds 8 steps of 2^(e-3). Round on that grid,
  // ties to even, with the arithmetic exact in float (a step is a power of 2).
  int exponent = 0;
  std::frexp(a, &exponent);  // a = m * 2^exponent, m in [0.5, 1).
  const int e = exponent - 1;  // a in [2^e, 2^(e+1)).
  const float step = std::ldexp(1.0f, (e < -6 ? -6 : e) - 3);
  const float q = std::nearbyint(a / step);  // Ties to even (default rounding).
  const float r = q * step;
  if (r >= kFp8E4M3Max) return sign | 0x7e;
  if (r == 0.0f) return sign;
  int re = 0;
  std::frexp(r, &re);
  const int biased = re - 1 + 7;
  if (biased <= 0) {
    // Subnormal: r = mantissa * 2^-9, mantissa in [1, 7].
    return sign | static_cast<uint8_t>(std::ldexp(r, 9));
  }
  // Normal: r = (8 + mantissa) * 2^(re - 1 - 3).
  const int mantissa = static_cast<int>(std::ldexp(r, -(re - 1) + 3)) - 8;
  return sign | static_cast<uint8_t>(biased << 3) | static_cast<uint8_t>(mantissa);
}

float Fp8E4M3ToFloat(uint8_t bits) {
  const int exponent = (bits >> 3) & 0x0f;
  const int mantissa = bits & 0x07;
  if (exponent == 0x0f && mantissa == 0x07) return std::nanf("");
  const float magnitude = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                        : std::ldexp(static_cast<float>(8 + mantissa),
                                                     exponent - 7 - 3);
  return (bits & 0x80) != 0 ? -magnitude : magnitude;
}

float Fp8E4M3Scale(absl::Span<const float> values) {
  float amax = 0.0f;
  for (float v : values) {
    if (!std::isnan(v)) amax = std::fmax(amax, std::fabs(v));
  }
  if (amax == 0.0f || std::isinf(amax)) return 1.0f;
  return amax / kFp8E4M3Max;
}

}  // namespace trident::numeric
