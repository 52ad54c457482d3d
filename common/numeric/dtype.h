// Element formats of weights, activations and KV entries, and the scalar
// conversions between them (bf16 and fp16 are stored as uint16_t bits).

#ifndef TRIDENT_COMMON_NUMERIC_DTYPE_H_
#define TRIDENT_COMMON_NUMERIC_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/strings/string_view.h"

namespace trident::numeric {

// kFP8E4M3 is only a KV cache element (with per-row scales kept beside it,
// kernels/cpu/paged_kv_fp8); the conversions below read its raw E4M3 values.
enum class DType { kF32, kBF16, kF16, kFP8E4M3 };

// Bytes per element.
constexpr size_t ElementSize(DType t) {
  return t == DType::kF32 ? 4 : (t == DType::kFP8E4M3 ? 1 : 2);
}

// "f32", "bf16", "f16", "fp8_e4m3".
absl::string_view DTypeName(DType t);

inline float Bf16ToFloat(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

// IEEE 754 binary16 to binary32, exact (subnormals, inf and NaN included).
float HalfToFloat(uint16_t bits);
// binary32 to binary16, round to nearest even, overflow to inf.
uint16_t FloatToHalf(float f);

// Bulk conversions. `src` and `dst` must not overlap.
void Bf16ToFloat(const uint16_t* src, float* dst, size_t n);
void FloatToBf16(const float* src, uint16_t* dst, size_t n);
void HalfToFloat(const uint16_t* src, float* dst, size_t n);
// Converts `n` elements of `src_type` at `src` to f32.
void ToFloat(DType src_type, const void* src, float* dst, size_t n);
// Converts `n` elements of `src_type` at `src` to bf16 (a copy when already bf16).
void ToBf16(DType src_type, const void* src, uint16_t* dst, size_t n);

}  // namespace trident::numeric

#endif  // TRIDENT_COMMON_NUMERIC_DTYPE_H_
