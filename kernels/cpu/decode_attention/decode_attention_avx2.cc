// AVX2 + FMA + F16C segment kernels, the fallback for CPUs without AVX-512:
// every KV dtype is widened to fp32 (bf16 by a 16-bit shift, f16 by
// vcvtph2ps) and both q·K and P·V are 8-wide fp32 FMA, so all dtypes are
// computed exactly in fp32. Same structure as the AVX-512 kernels
// (decode_attention_avx512_inl.h), at 8 lanes and 16 registers.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/decode_attention/decode_attention_internal.h"

#define TRIDENT_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace trident::kernels::cpu::decode_internal {
namespace {

struct Bf16 {
  uint16_t bits;
};
struct Half {
  uint16_t bits;
};

TRIDENT_AVX2 inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
TRIDENT_AVX2 inline __m256 Load8(const Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
TRIDENT_AVX2 inline __m256 Load8(const Bf16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

// e^x as in the AVX-512 kernels; 2^n built in the exponent bits (n in
// [-126, 127] after the clamp).
TRIDENT_AVX2 inline __m256 Exp(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.0f)), _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i bits = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// Lane i of the result is the sum of the 8 lanes of a[i].
TRIDENT_AVX2 inline __m256 Reduce8(const __m256* a) {
  const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

TRIDENT_AVX2 inline float HorizontalMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

TRIDENT_AVX2 inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Scores of 8 K rows from k (row stride head_dim) against fp32 q; rows at or
// past `valid` repeat row valid - 1 (masked later).
template <typename T>
TRIDENT_AVX2 __m256 Dot8(const float* q, const T* k, int32_t head_dim, int32_t valid) {
  __m256 acc[8];
  const T* rows[8];
  for (int t = 0; t < 8; ++t) {
    acc[t] = _mm256_setzero_ps();
    rows[t] = k + static_cast<int64_t>(std::min(t, valid - 1)) * head_dim;
  }
  for (int32_t d = 0; d < head_dim; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    for (int t = 0; t < 8; ++t) acc[t] = _mm256_fmadd_ps(qv, Load8(rows[t] + d), acc[t]);
  }
  return Reduce8(acc);
}

// Online-softmax update of one row with the scores of n <= 32 tokens in s[4].
TRIDENT_AVX2 void SoftmaxRow(__m256* s, int32_t n, float* max, float* sum, float* p,
                             float* corr) {
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 valid[4];
  __m256 tile_max = neg_inf;
  for (int i = 0; i < 4; ++i) {
    valid[i] = _mm256_cmp_ps(lane, _mm256_set1_ps(static_cast<float>(n - 8 * i)), _CMP_LT_OQ);
    s[i] = _mm256_blendv_ps(neg_inf, s[i], valid[i]);
    tile_max = _mm256_max_ps(tile_max, s[i]);
  }
  const float old_max = *max;
  const float new_max = std::max(old_max, HorizontalMax(tile_max));
  const float c = old_max == -std::numeric_limits<float>::infinity() ? 0.0f
                                                                     : std::exp(old_max - new_max);
  const __m256 m = _mm256_set1_ps(new_max);
  __m256 total = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    const __m256 e = _mm256_and_ps(Exp(_mm256_sub_ps(s[i], m)), valid[i]);
    _mm256_storeu_ps(p + 8 * i, e);
    total = _mm256_add_ps(total, e);
  }
  *sum = *sum * c + HorizontalSum(total);
  *max = new_max;
  *corr = c;
}

// sum[r][0, 2) = 16 floats of accumulator row r, scaled by corr[r].
template <int kRows>
TRIDENT_AVX2 inline void LoadScaledAcc(const float* acc, int64_t acc_stride, const float* corr,
                                       __m256 (*sum)[2]) {
  for (int r = 0; r < kRows; ++r) {
    const __m256 c = _mm256_set1_ps(corr[r]);
    for (int j = 0; j < 2; ++j) {
      sum[r][j] = _mm256_mul_ps(_mm256_loadu_ps(acc + r * acc_stride + 8 * j), c);
    }
  }
}

template <int kRows>
TRIDENT_AVX2 inline void StoreAcc(__m256 (*sum)[2], float* acc, int64_t acc_stride) {
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < 2; ++j) _mm256_storeu_ps(acc + r * acc_stride + 8 * j, sum[r][j]);
  }
}

// q * scale into scratch.q32 and, unless resuming, a fresh online-softmax
// state for every row of the group.
inline void StartSegment(const SegmentArgs& a) {
  const int64_t count = static_cast<int64_t>(a.group) * a.head_dim;
  for (int64_t i = 0; i < count; ++i) a.scratch.q32[i] = a.q[i] * a.scale;
  for (int32_t g = 0; g < a.group && !a.resume; ++g) {
    a.max[g] = -std::numeric_limits<float>::infinity();
    a.sum[g] = 0.0f;
    std::fill_n(a.acc + g * a.acc_stride, a.head_dim, 0.0f);
  }
}

// acc[r][0, 16) = acc * corr[r] + sum_t p[r][t] * v[t][0, 16) for kRows rows.
template <int kRows, typename T>
TRIDENT_AVX2 void PvTile(const T* v, int64_t head_dim, int32_t n, const float* p,
                         const float* corr, float* acc, int64_t acc_stride) {
  __m256 sum[kRows][2];
  LoadScaledAcc<kRows>(acc, acc_stride, corr, sum);
  for (int32_t t = 0; t < n; ++t) {
    const __m256 v0 = Load8(v + t * head_dim);
    const __m256 v1 = Load8(v + t * head_dim + 8);
    for (int r = 0; r < kRows; ++r) {
      const __m256 pr = _mm256_broadcast_ss(p + r * kTileTokens + t);
      sum[r][0] = _mm256_fmadd_ps(pr, v0, sum[r][0]);
      sum[r][1] = _mm256_fmadd_ps(pr, v1, sum[r][1]);
    }
  }
  StoreAcc<kRows>(sum, acc, acc_stride);
}

template <typename T>
TRIDENT_AVX2 void Pv(const SegmentArgs& a, const T* v, int32_t n) {
  for (int32_t g = 0; g < a.group; g += 4) {
    const float* p = a.scratch.p + g * kTileTokens;
    const float* corr = a.scratch.corr + g;
    for (int32_t d = 0; d < a.head_dim; d += 16) {
      float* acc = a.acc + g * a.acc_stride + d;
      switch (std::min(4, a.group - g)) {
        case 4:
          PvTile<4>(v + d, a.head_dim, n, p, corr, acc, a.acc_stride);
          break;
        case 3:
          PvTile<3>(v + d, a.head_dim, n, p, corr, acc, a.acc_stride);
          break;
        case 2:
          PvTile<2>(v + d, a.head_dim, n, p, corr, acc, a.acc_stride);
          break;
        default:
          PvTile<1>(v + d, a.head_dim, n, p, corr, acc, a.acc_stride);
          break;
      }
    }
  }
}

template <typename T>
TRIDENT_AVX2 void Segment(const SegmentArgs& a) {
  StartSegment(a);
  const int32_t bs = a.block_size;
  const int64_t head_bytes = static_cast<int64_t>(bs) * a.head_dim * sizeof(T);
  for (int32_t b = a.token_begin / bs; b * bs < a.token_end; ++b) {
    const T* k = BlockK<T>(a, b);
    if ((b + 1) * bs < a.token_end) {
      const char* next = reinterpret_cast<const char*>(BlockK<T>(a, b + 1));
      for (int64_t i = 0; i < head_bytes; i += 64) {
        _mm_prefetch(next + i, _MM_HINT_T0);
        _mm_prefetch(next + a.value_offset_elems * sizeof(T) + i, _MM_HINT_T0);
      }
    }
    const int32_t first = std::max(a.token_begin - b * bs, 0);
    const int32_t last = std::min(a.token_end - b * bs, bs);
    for (int32_t t = first; t < last; t += kTileTokens) {
      const int32_t n = std::min(kTileTokens, last - t);
      const T* kt = k + static_cast<int64_t>(t) * a.head_dim;
      for (int32_t g = 0; g < a.group; ++g) {
        const float* q = a.scratch.q32 + static_cast<int64_t>(g) * a.head_dim;
        __m256 s[4];
        for (int i = 0; i < 4; ++i) {
          s[i] = 8 * i < n ? Dot8(q, kt + 8 * i * static_cast<int64_t>(a.head_dim), a.head_dim,
                                  std::min(8, n - 8 * i))
                           : _mm256_setzero_ps();
        }
        SoftmaxRow(s, n, a.max + g, a.sum + g, a.scratch.p + g * kTileTokens,
                   a.scratch.corr + g);
      }
      Pv(a, kt + a.value_offset_elems, n);
    }
  }
}

// ---- DecodeKvPacking::kPairs (bf16) ----
// A 32-bit word of the pair layout holds two bf16: the low one widened by a
// shift, the high one by masking the low half. Exact fp32 math, as above.

TRIDENT_AVX2 inline __m256 LowBf16(__m256i words) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(words, 16));
}
TRIDENT_AVX2 inline __m256 HighBf16(__m256i words) {
  return _mm256_castsi256_ps(_mm256_and_si256(words, _mm256_set1_epi32(-65536)));
}
TRIDENT_AVX2 inline __m256i Load8Words(const uint16_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// Scores of the tile's 32 tokens (s[r][c]: tokens 8c..8c+7) for kRows q heads
// (scaled fp32 rows of q32 from row g).
template <int kRows>
TRIDENT_AVX2 void PairScores(const SegmentArgs& a, const PairTile& tile, int32_t g,
                             __m256 (*s)[4]) {
  for (int r = 0; r < kRows; ++r) {
    for (int c = 0; c < 4; ++c) s[r][c] = _mm256_setzero_ps();
  }
  const float* q = a.scratch.q32 + static_cast<int64_t>(g) * a.head_dim;
  for (int32_t i = 0; i < a.head_dim / 2; ++i) {
    for (int c = 0; c < 4; ++c) {
      const __m256i w = Load8Words(tile.k + i * tile.k_row + 16 * c);
      const __m256 lo = LowBf16(w);
      const __m256 hi = HighBf16(w);
      for (int r = 0; r < kRows; ++r) {
        const float* qr = q + r * a.head_dim + 2 * i;
        s[r][c] = _mm256_fmadd_ps(_mm256_broadcast_ss(qr), lo, s[r][c]);
        s[r][c] = _mm256_fmadd_ps(_mm256_broadcast_ss(qr + 1), hi, s[r][c]);
      }
    }
  }
}

// acc[r][0, 16) = acc * corr[r] + sum_t p[r][t] * V[t][0, 16) over n tokens
// of the tile's V at the first dim (the odd token of a last half pair, past
// n, is never read into the sum).
template <int kRows>
TRIDENT_AVX2 void PairPvTile(const uint16_t* v, int32_t head_dim, int32_t n, const float* p,
                             const float* corr, float* acc, int64_t acc_stride) {
  __m256 sum[kRows][2];
  LoadScaledAcc<kRows>(acc, acc_stride, corr, sum);
  for (int32_t t = 0; t < n; t += 2) {
    for (int j = 0; j < 2; ++j) {
      const __m256i w = Load8Words(v + static_cast<int64_t>(t) * head_dim + 16 * j);
      const __m256 lo = LowBf16(w);
      for (int r = 0; r < kRows; ++r) {
        sum[r][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * kTileTokens + t), lo, sum[r][j]);
      }
      if (t + 1 < n) {
        const __m256 hi = HighBf16(w);
        for (int r = 0; r < kRows; ++r) {
          sum[r][j] =
              _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * kTileTokens + t + 1), hi, sum[r][j]);
        }
      }
    }
  }
  StoreAcc<kRows>(sum, acc, acc_stride);
}

// One tile for kRows (<= 2) q heads from g: scores, softmax, P·V.
template <int kRows>
TRIDENT_AVX2 void PairRows(const SegmentArgs& a, const PairTile& tile, int32_t n, int32_t g) {
  __m256 s[kRows][4];
  PairScores<kRows>(a, tile, g, s);
  for (int r = 0; r < kRows; ++r) {
    SoftmaxRow(s[r], n, a.max + g + r, a.sum + g + r, a.scratch.p + (g + r) * kTileTokens,
               a.scratch.corr + g + r);
  }
  for (int32_t d = 0; d < a.head_dim; d += 16) {
    PairPvTile<kRows>(tile.v + 2 * d, a.head_dim, n, a.scratch.p + g * kTileTokens,
                      a.scratch.corr + g, a.acc + g * a.acc_stride + d, a.acc_stride);
  }
}

TRIDENT_AVX2 void PairSegment(const SegmentArgs& a) {
  StartSegment(a);
  for (int32_t t = a.token_begin; t < a.token_end; t += kTileTokens) {
    const PairTile tile = PairTileAt(a, t);
    const int32_t n = std::min(kTileTokens, a.token_end - t);
    for (int32_t g = 0; g < a.group; g += 2) {
      if (g + 1 < a.group) {
        PairRows<2>(a, tile, n, g);
      } else {
        PairRows<1>(a, tile, n, g);
      }
    }
  }
}

}  // namespace

IsaKernels Avx2Kernels() {
  IsaKernels k;
  k.f32 = Segment<float>;
  k.bf16 = Segment<Bf16>;
  k.f16 = Segment<Half>;
  k.bf16_pairs = PairSegment;
  return k;
}

}  // namespace trident::kernels::cpu::decode_internal
