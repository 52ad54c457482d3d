#include "common/numeric/dtype.h"

#include <cmath>
#include <cstring>

#include "common/numeric/fp8.h"

namespace trident::numeric {

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kFP8E4M3:
      return "fp8_e4m3";
  }
  return "unknown";
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {
      // Subnormal: normalize.
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      mant &= 0x3ffu;
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Subnormal or zero in fp16: scale so the integer part is the mantissa.
    const float scaled = std::fabs(f) * 16777216.0f;  // 2^24
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t rounding = 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>((abs - 0x38000000u + rounding) >> 13);
}

// The bulk conversions are written so that the compiler vectorizes them
// (no aliasing, no branch): 3-4x the scalar loops' speed. The remote
// attention path converts every q, k, v and o row. Elements are read and
// written through memcpy: wire buffers need not be 2-byte aligned.
void Bf16ToFloat(const uint16_t* __restrict src, float* __restrict dst, size_t n) {
  const char* bytes = reinterpret_cast<const char*>(src);
  for (size_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, bytes + i * sizeof(b), sizeof(b));
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    std::memcpy(&dst[i], &u, sizeof(u));
  }
}

void FloatToBf16(const float* __restrict src, uint16_t* __restrict dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &src[i], sizeof(u));
    // As FloatToBf16(float): round to nearest even; NaN stays NaN (quiet).
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet = (u >> 16) | 0x0040u;
    const uint16_t b = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
    std::memcpy(reinterpret_cast<char*>(dst) + i * sizeof(b), &b, sizeof(b));
  }
}

void HalfToFloat(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
}

void ToFloat(DType src_type, const void* src, float* dst, size_t n) {
  switch (src_type) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16:
      Bf16ToFloat(static_cast<const uint16_t*>(src), dst, n);
      return;
    case DType::kF16:
      HalfToFloat(static_cast<const uint16_t*>(src), dst, n);
      return;
    case DType::kFP8E4M3:
      for (size_t i = 0; i < n; ++i) dst[i] = Fp8E4M3ToFloat(static_cast<const uint8_t*>(src)[i]);
      return;
  }
}

void ToBf16(DType src_type, const void* src, uint16_t* dst, size_t n) {
  switch (src_type) {
    case DType::kF32:
      FloatToBf16(static_cast<const float*>(src), dst, n);
      return;
    case DType::kBF16:
      std::memcpy(dst, src, n * sizeof(uint16_t));
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        dst[i] = FloatToBf16(HalfToFloat(static_cast<const uint16_t*>(src)[i]));
      }
      return;
    case DType::kFP8E4M3:
      for (size_t i = 0; i < n; ++i) {
        dst[i] = FloatToBf16(Fp8E4M3ToFloat(static_cast<const uint8_t*>(src)[i]));
      }
      return;
  }
}

}  // namespace trident::numeric
