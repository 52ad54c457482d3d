// AVX2 + FMA + F16C segment kernels. Initial version: plain loops the
// compiler vectorizes; replaced by intrinsics.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu/decode_attention/decode_attention_internal.h"

#define TRIDENT_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace trident::kernels::cpu::decode_internal {
namespace {

TRIDENT_AVX2 inline float Widen(float x) { return x; }
TRIDENT_AVX2 inline float WidenBf16(uint16_t x) {
  const uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
TRIDENT_AVX2 inline float WidenF16(uint16_t x) { return _cvtsh_ss(x); }

template <typename T, float (*kWiden)(T)>
TRIDENT_AVX2 void SegmentGeneric(const SegmentArgs& a) {
  const int32_t d = a.head_dim;
  const T* k0 = static_cast<const T*>(a.k);
  for (int32_t g = 0; g < a.group; ++g) {
    float m = -std::numeric_limits<float>::infinity();
    float l = 0.0f;
    float* acc = a.acc + g * a.acc_stride;
    std::fill_n(acc, d, 0.0f);
    const float* q = a.q + static_cast<int64_t>(g) * d;
    for (int32_t t = a.token_begin; t < a.token_end; ++t) {
      const T* k = k0 + (t / a.block_size) * a.block_stride_elems +
                   static_cast<int64_t>(t % a.block_size) * d;
      const T* v = k + a.value_offset_elems;
      float dot = 0.0f;
      for (int32_t j = 0; j < d; ++j) dot += q[j] * kWiden(k[j]);
      const float s = dot * a.scale;
      const float new_m = std::max(m, s);
      const float c = std::exp(m - new_m);
      const float p = std::exp(s - new_m);
      l = l * c + p;
      for (int32_t j = 0; j < d; ++j) acc[j] = acc[j] * c + p * kWiden(v[j]);
      m = new_m;
    }
    a.max[g] = m;
    a.sum[g] = l;
  }
}

}  // namespace

IsaKernels Avx2Kernels() {
  IsaKernels k;
  k.f32 = SegmentGeneric<float, Widen>;
  k.bf16 = SegmentGeneric<uint16_t, WidenBf16>;
  k.f16 = SegmentGeneric<uint16_t, WidenF16>;
  return k;
}

}  // namespace trident::kernels::cpu::decode_internal
