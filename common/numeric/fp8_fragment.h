#ifndef TRIDENT_COMMON_NUMERIC_FP8_FRAGMENT_H_
#define TRIDENT_COMMON_NUMERIC_FP8_FRAGMENT_H_

// The order of the FP8 KV cache's 16-element groups (a K row's 16 dims, a V
// row's 16 tokens; kernels/cpu/paged_kv_fp8 has the layout): index i sits at
// byte Fp8FragmentPosition(i), so that the 4 bytes at 4 l hold indices 2 l,
// 2 l + 1, 2 l + 8 and 2 l + 9, lane quad l's two B registers of an
// m16n8k16 MMA. Header-only and constexpr: CUDA kernels use it unchanged
// (nvcc with --expt-relaxed-constexpr).

#include <cstdint>

namespace trident::numeric {

constexpr int32_t Fp8FragmentPosition(int32_t i) {
  return i < 8 ? 4 * (i / 2) + i % 2 : 4 * ((i - 8) / 2) + 2 + i % 2;
}

}  // namespace trident::numeric

#endif  // TRIDENT_COMMON_NUMERIC_FP8_FRAGMENT_H_
