// Internal to //kernels/cpu/decode_attention: the AVX-512 building blocks
// shared by the AVX512-BF16 and AMX segment kernels (loads, exp, the online
// softmax, P·V and the block loop). Include only from files whose callers
// carry TRIDENT_AVX512 (or a superset).

#ifndef TRIDENT_KERNELS_CPU_DECODE_ATTENTION_DECODE_ATTENTION_AVX512_INL_H_
#define TRIDENT_KERNELS_CPU_DECODE_ATTENTION_DECODE_ATTENTION_AVX512_INL_H_

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/decode_attention/decode_attention_internal.h"

#define TRIDENT_AVX512 __attribute__((target("avx512f,avx512bf16,avx2,fma,f16c")))

namespace trident::kernels::cpu::decode_internal::avx512 {

// Element types of the KV cache: distinct types for the two 16-bit formats.
struct Bf16 {
  uint16_t bits;
};
struct Half {
  uint16_t bits;
};

// 16 consecutive elements widened to fp32.
TRIDENT_AVX512 inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
TRIDENT_AVX512 inline __m512 Load16(const Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
TRIDENT_AVX512 inline __m512 Load16(const Bf16* p) {
  const __m512i wide =
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

// e^x, about 1 ulp (Cephes expf polynomial after reduction by ln 2); inputs
// below -87 give e^-87 (about 1.6e-38), not a denormal or 0.
TRIDENT_AVX512 inline __m512 Exp(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// Lane i of the result is the sum of the 16 lanes of a[i]: a transposing
// add tree, 45 shuffles and adds for 16 dot products.
TRIDENT_AVX512 inline __m512 Reduce16(const __m512* a) {
  __m512 b[8];
  for (int i = 0; i < 8; ++i) {
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  }
  __m512 c[4];
  for (int i = 0; i < 4; ++i) {
    c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  __m512 e[2];
  for (int i = 0; i < 2; ++i) {
    e[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// Online-softmax update of one row with the scores of up to 32 tokens (s[0]:
// tokens 0-15, s[1]: 16-31; lanes at or past n are ignored): updates *max and
// *sum, writes e^(s - new max) to p[0, 32) (0 past n) and the factor the
// row's accumulator must be scaled by to *corr.
TRIDENT_AVX512 inline void SoftmaxRow(const __m512* s, int32_t n, float* max, float* sum,
                                      float* p, float* corr) {
  const __mmask16 m0 = n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1);
  const __mmask16 m1 = n >= 32 ? 0xffff : n <= 16 ? 0 : static_cast<__mmask16>((1u << (n - 16)) - 1);
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 s0 = _mm512_mask_mov_ps(neg_inf, m0, s[0]);
  const __m512 s1 = _mm512_mask_mov_ps(neg_inf, m1, s[1]);
  const float tile_max = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
  const float old_max = *max;
  const float new_max = std::max(old_max, tile_max);
  const float c = old_max == -std::numeric_limits<float>::infinity() ? 0.0f
                                                                     : std::exp(old_max - new_max);
  const __m512 m = _mm512_set1_ps(new_max);
  const __m512 p0 = _mm512_maskz_mov_ps(m0, Exp(_mm512_sub_ps(s0, m)));
  const __m512 p1 = _mm512_maskz_mov_ps(m1, Exp(_mm512_sub_ps(s1, m)));
  _mm512_storeu_ps(p, p0);
  _mm512_storeu_ps(p + 16, p1);
  *sum = *sum * c + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
  *max = new_max;
  *corr = c;
}

// sum[r][j] = 16 floats j of accumulator row r, scaled by corr[r].
template <int kRows, int kChunks>
TRIDENT_AVX512 inline void LoadScaledAcc(const float* acc, int64_t acc_stride, const float* corr,
                                         __m512 (*sum)[kChunks]) {
  for (int r = 0; r < kRows; ++r) {
    const __m512 c = _mm512_set1_ps(corr[r]);
    for (int j = 0; j < kChunks; ++j) {
      sum[r][j] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * acc_stride + 16 * j), c);
    }
  }
}

template <int kRows, int kChunks>
TRIDENT_AVX512 inline void StoreAcc(__m512 (*sum)[kChunks], float* acc, int64_t acc_stride) {
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < kChunks; ++j) _mm512_storeu_ps(acc + r * acc_stride + 16 * j, sum[r][j]);
  }
}

// acc[r][dim0, dim0 + 16 * kChunks) = acc * corr[r] + sum_t p_r[t] * v[t]
// for kRows rows and n tokens of V rows `v` (row stride head_dim).
template <int kRows, int kChunks, typename T>
TRIDENT_AVX512 void PvTile(const T* v, int64_t head_dim, int32_t n, const float* const* p_rows,
                           int64_t p_token_stride, const float* corr, float* acc,
                           int64_t acc_stride) {
  __m512 sum[kRows][kChunks];
  LoadScaledAcc<kRows, kChunks>(acc, acc_stride, corr, sum);
  for (int32_t t = 0; t < n; ++t) {
    __m512 vv[kChunks];
    for (int j = 0; j < kChunks; ++j) vv[j] = Load16(v + t * head_dim + 16 * j);
    for (int r = 0; r < kRows; ++r) {
      const __m512 p = _mm512_set1_ps(p_rows[r][t * p_token_stride]);
      for (int j = 0; j < kChunks; ++j) sum[r][j] = _mm512_fmadd_ps(p, vv[j], sum[r][j]);
    }
  }
  StoreAcc<kRows, kChunks>(sum, acc, acc_stride);
}

template <int kRows, int kD, typename T>
TRIDENT_AVX512 void PvRows(const T* v, int64_t runtime_dim, int32_t n, const float* const* p_rows,
                           int64_t p_token_stride, const float* corr, float* acc,
                           int64_t acc_stride) {
  const int64_t head_dim = kD > 0 ? kD : runtime_dim;
  int64_t dim = 0;
  for (; dim + 64 <= head_dim; dim += 64) {
    PvTile<kRows, 4>(v + dim, head_dim, n, p_rows, p_token_stride, corr, acc + dim, acc_stride);
  }
  switch ((head_dim - dim) / 16) {
    case 1:
      PvTile<kRows, 1>(v + dim, head_dim, n, p_rows, p_token_stride, corr, acc + dim, acc_stride);
      break;
    case 2:
      PvTile<kRows, 2>(v + dim, head_dim, n, p_rows, p_token_stride, corr, acc + dim, acc_stride);
      break;
    case 3:
      PvTile<kRows, 3>(v + dim, head_dim, n, p_rows, p_token_stride, corr, acc + dim, acc_stride);
      break;
  }
}

// P·V of one tile for every row of the group, four rows at a time (so each
// widened V vector feeds four FMAs). `p_row(g)` is row g's first weight,
// weights of consecutive tokens p_token_stride apart.
template <int kD, typename T, typename PRow>
TRIDENT_AVX512 void PvGroup(const SegmentArgs& a, const T* v, int32_t n, PRow p_row,
                            int64_t p_token_stride) {
  const float* corr = a.scratch.corr;
  for (int32_t g = 0; g < a.group; g += 4) {
    const float* rows[4];
    const int32_t count = std::min(4, a.group - g);
    for (int32_t r = 0; r < count; ++r) rows[r] = p_row(g + r);
    float* acc = a.acc + g * a.acc_stride;
    switch (count) {
      case 4:
        PvRows<4, kD>(v, a.head_dim, n, rows, p_token_stride, corr + g, acc, a.acc_stride);
        break;
      case 3:
        PvRows<3, kD>(v, a.head_dim, n, rows, p_token_stride, corr + g, acc, a.acc_stride);
        break;
      case 2:
        PvRows<2, kD>(v, a.head_dim, n, rows, p_token_stride, corr + g, acc, a.acc_stride);
        break;
      default:
        PvRows<1, kD>(v, a.head_dim, n, rows, p_token_stride, corr + g, acc, a.acc_stride);
        break;
    }
  }
}

// Prefetches one kv head's K and V rows of a block into L1.
template <typename T>
TRIDENT_AVX512 inline void PrefetchBlock(const T* k, int64_t value_offset, int64_t bytes) {
  const char* kb = reinterpret_cast<const char*>(k);
  const char* vb = reinterpret_cast<const char*>(k + value_offset);
  for (int64_t i = 0; i < bytes; i += 64) {
    _mm_prefetch(kb + i, _MM_HINT_T0);
    _mm_prefetch(vb + i, _MM_HINT_T0);
  }
}

// Scores of kv rows of bf16 K against q rounded to bf16: vdpbf16ps over pairs
// of dims, 16 tokens per Reduce16. Rows: [group][kTileTokens] in scratch.p.
template <int kD>
struct Bf16Scores {
  using Elem = Bf16;
  static constexpr int kHeadDim = kD;

  // q * scale to bf16, rows padded with zeros to a multiple of 32 dims.
  TRIDENT_AVX512 static void Prepare(const SegmentArgs& a) {
    const int32_t padded = (a.head_dim + 31) / 32 * 32;
    const __m512 scale = _mm512_set1_ps(a.scale);
    for (int32_t g = 0; g < a.group; ++g) {
      const float* q = a.q + static_cast<int64_t>(g) * a.head_dim;
      uint16_t* out = a.scratch.q16 + static_cast<int64_t>(g) * padded;
      for (int32_t d = 0; d < padded; d += 32) {
        const __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(q + d), scale);
        const __m512 hi = d + 16 < a.head_dim ? _mm512_mul_ps(_mm512_loadu_ps(q + d + 16), scale)
                                              : _mm512_setzero_ps();
        _mm512_storeu_si512(out + d, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
      }
    }
  }

  // Dot products of q16 (padded row) with 16 K rows starting at k; rows at
  // or past `valid` repeat row valid - 1 (their lanes are masked later).
  TRIDENT_AVX512 static __m512 Dot16(const uint16_t* q16, const Bf16* k, int32_t runtime_dim,
                                     int32_t valid) {
    const int32_t head_dim = kD > 0 ? kD : runtime_dim;
    __m512 acc[16];
    for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
    const int64_t stride = head_dim;
    if (valid == 16 && head_dim % 32 == 0) {  // Full tile: constant row offsets.
      for (int32_t d = 0; d < head_dim; d += 32) {
        const __m512bh q = (__m512bh)_mm512_loadu_si512(q16 + d);
        for (int t = 0; t < 16; ++t) {
          acc[t] = _mm512_dpbf16_ps(acc[t], q, (__m512bh)_mm512_loadu_si512(k + t * stride + d));
        }
      }
      return Reduce16(acc);
    }
    const int32_t full = head_dim / 32 * 32;
    for (int32_t d = 0; d < full; d += 32) {
      const __m512bh q = (__m512bh)_mm512_loadu_si512(q16 + d);
      for (int t = 0; t < 16; ++t) {
        const Bf16* row = k + std::min(t, valid - 1) * stride + d;
        acc[t] = _mm512_dpbf16_ps(acc[t], q, (__m512bh)_mm512_loadu_si512(row));
      }
    }
    if (full < head_dim) {  // 16 dims left: the upper half of q16 is zero.
      const __m512bh q = (__m512bh)_mm512_loadu_si512(q16 + full);
      for (int t = 0; t < 16; ++t) {
        const Bf16* row = k + std::min(t, valid - 1) * stride + full;
        const __m512i kv =
            _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)));
        acc[t] = _mm512_dpbf16_ps(acc[t], q, (__m512bh)kv);
      }
    }
    return Reduce16(acc);
  }

  TRIDENT_AVX512 static void Tile(const SegmentArgs& a, const Bf16* k, int32_t n) {
    const int32_t padded = (a.head_dim + 31) / 32 * 32;
    for (int32_t g = 0; g < a.group; ++g) {
      const uint16_t* q16 = a.scratch.q16 + static_cast<int64_t>(g) * padded;
      __m512 s[2];
      s[0] = Dot16(q16, k, a.head_dim, std::min(n, 16));
      s[1] = n > 16 ? Dot16(q16, k + 16 * static_cast<int64_t>(a.head_dim), a.head_dim, n - 16)
                    : _mm512_setzero_ps();
      SoftmaxRow(s, n, a.max + g, a.sum + g, a.scratch.p + g * kTileTokens, a.scratch.corr + g);
    }
  }

  TRIDENT_AVX512 static void Pv(const SegmentArgs& a, const Bf16* v, int32_t n) {
    const float* p = a.scratch.p;
    PvGroup<kD>(a, v, n, [p](int32_t g) { return p + g * kTileTokens; }, 1);
  }
};

// Scores of f32 or f16 K rows against fp32 q (scaled): FMA over 16 dims.
template <typename T, int kD>
struct WideScores {
  using Elem = T;
  static constexpr int kHeadDim = kD;

  TRIDENT_AVX512 static void Prepare(const SegmentArgs& a) {
    const int64_t count = static_cast<int64_t>(a.group) * a.head_dim;
    const __m512 scale = _mm512_set1_ps(a.scale);
    for (int64_t i = 0; i < count; i += 16) {
      _mm512_storeu_ps(a.scratch.q32 + i, _mm512_mul_ps(_mm512_loadu_ps(a.q + i), scale));
    }
  }

  TRIDENT_AVX512 static __m512 Dot16(const float* q, const T* k, int32_t runtime_dim,
                                     int32_t valid) {
    const int32_t head_dim = kD > 0 ? kD : runtime_dim;
    __m512 acc[16];
    for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
    const int64_t stride = head_dim;
    if (valid == 16) {  // Full tile: constant row offsets.
      for (int32_t d = 0; d < head_dim; d += 16) {
        const __m512 qv = _mm512_loadu_ps(q + d);
        for (int t = 0; t < 16; ++t) {
          acc[t] = _mm512_fmadd_ps(qv, Load16(k + t * stride + d), acc[t]);
        }
      }
      return Reduce16(acc);
    }
    for (int32_t d = 0; d < head_dim; d += 16) {
      const __m512 qv = _mm512_loadu_ps(q + d);
      for (int t = 0; t < 16; ++t) {
        acc[t] = _mm512_fmadd_ps(qv, Load16(k + std::min(t, valid - 1) * stride + d), acc[t]);
      }
    }
    return Reduce16(acc);
  }

  TRIDENT_AVX512 static void Tile(const SegmentArgs& a, const T* k, int32_t n) {
    for (int32_t g = 0; g < a.group; ++g) {
      const float* q = a.scratch.q32 + static_cast<int64_t>(g) * a.head_dim;
      __m512 s[2];
      s[0] = Dot16(q, k, a.head_dim, std::min(n, 16));
      s[1] = n > 16 ? Dot16(q, k + 16 * static_cast<int64_t>(a.head_dim), a.head_dim, n - 16)
                    : _mm512_setzero_ps();
      SoftmaxRow(s, n, a.max + g, a.sum + g, a.scratch.p + g * kTileTokens, a.scratch.corr + g);
    }
  }

  TRIDENT_AVX512 static void Pv(const SegmentArgs& a, const T* v, int32_t n) {
    const float* p = a.scratch.p;
    PvGroup<kD>(a, v, n, [p](int32_t g) { return p + g * kTileTokens; }, 1);
  }
};

// The segment: blocks in order, tiles of up to kTileTokens tokens inside a
// block, the next block of the segment prefetched while one is processed.
template <typename Scores>
TRIDENT_AVX512 void BlockLoop(const SegmentArgs& a) {
  using T = typename Scores::Elem;
  for (int32_t g = 0; g < a.group && !a.resume; ++g) {
    a.max[g] = -std::numeric_limits<float>::infinity();
    a.sum[g] = 0.0f;
    std::fill_n(a.acc + g * a.acc_stride, a.head_dim, 0.0f);
  }
  Scores::Prepare(a);
  const int32_t bs = a.block_size;
  const int64_t head_bytes = static_cast<int64_t>(bs) * a.head_dim * sizeof(T);
  for (int32_t b = a.token_begin / bs; b * bs < a.token_end; ++b) {
    const T* k = BlockK<T>(a, b);
    if ((b + 1) * bs < a.token_end) {
      PrefetchBlock(BlockK<T>(a, b + 1), a.value_offset_elems, head_bytes);
    }
    const int32_t first = std::max(a.token_begin - b * bs, 0);
    const int32_t last = std::min(a.token_end - b * bs, bs);
    for (int32_t t = first; t < last; t += kTileTokens) {
      const int32_t n = std::min(kTileTokens, last - t);
      const T* kt = k + static_cast<int64_t>(t) * a.head_dim;
      Scores::Tile(a, kt, n);
      Scores::Pv(a, kt + a.value_offset_elems, n);
    }
  }
}

}  // namespace trident::kernels::cpu::decode_internal::avx512

#endif  // TRIDENT_KERNELS_CPU_DECODE_ATTENTION_DECODE_ATTENTION_AVX512_INL_H_
