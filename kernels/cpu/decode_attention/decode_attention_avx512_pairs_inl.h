// Internal to //kernels/cpu/decode_attention: the AVX512-BF16 segment kernel
// for bf16 KV packed in VNNI pairs (DecodeKvPacking::kPairs). Include only
// from files whose callers carry TRIDENT_AVX512 (or a superset).
//
// One kv head's share of a block, block_size (bs) tokens, bs % 32 == 0:
//   K: [head_dim / 2][bs][2]: 32-bit word (i, t) = (K[t][2i], K[t][2i + 1])
//   V: [bs / 2][head_dim][2]: 32-bit word (j, d) = (V[2j][d], V[2j + 1][d])
//
// Per tile of 32 tokens:
//   q·K  one 64-byte load holds dim pair i of 16 tokens; vdpbf16ps against
//        the broadcast pair (q[2i], q[2i + 1]) of a q head adds both products
//        into that token's lane. 16 tokens a vector, no horizontal sums.
//   P·V  one 64-byte load holds 16 dims of the token pair (2j, 2j + 1);
//        vdpbf16ps against the broadcast weights (p[2j], p[2j + 1]) (rounded
//        to bf16) adds both tokens into that dim's lane. No widening.
// Each K or V vector feeds up to four q heads. The K and V of the tile the
// thread reads next (this kv head's, or the next kv head's: see
// SegmentArgs::next_token; 16 KiB at head_dim 128) are prefetched into L1
// while the scores of this one run. On the GPU host's Xeon this read 0.78-0.98
// of the streaming-read ceiling, against 0.60-0.78 with no prefetch and
// 0.62-0.76 prefetching into L2 (bench/RESULTS.md); an AMD EPYC preferred L2.

#ifndef TRIDENT_KERNELS_CPU_DECODE_ATTENTION_DECODE_ATTENTION_AVX512_PAIRS_INL_H_
#define TRIDENT_KERNELS_CPU_DECODE_ATTENTION_DECODE_ATTENTION_AVX512_PAIRS_INL_H_

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu/decode_attention/decode_attention_avx512_inl.h"
#include "kernels/cpu/decode_attention/decode_attention_internal.h"

namespace trident::kernels::cpu::decode_internal::avx512 {

// The 32-bit word at p (a bf16 pair) in all 16 lanes.
TRIDENT_AVX512 inline __m512bh BroadcastPair(const uint16_t* p) {
  uint32_t word;
  std::memcpy(&word, p, sizeof(word));
  return (__m512bh)_mm512_set1_epi32(static_cast<int>(word));
}

TRIDENT_AVX512 inline __m512bh LoadPairs(const uint16_t* p) {
  return (__m512bh)_mm512_loadu_si512(p);
}

// Prefetches K rows [i, i + 2) and V lines [2i, 2i + 4) of a tile's 32
// tokens (K rows are 128 bytes; V is 64 * head_dim contiguous bytes).
TRIDENT_AVX512 inline void PrefetchPairRows(const PairTile& next, int32_t i) {
  const char* k = reinterpret_cast<const char*>(next.k + i * next.k_row);
  const char* k1 = reinterpret_cast<const char*>(next.k + (i + 1) * next.k_row);
  const char* v = reinterpret_cast<const char*>(next.v) + 128 * i;
  _mm_prefetch(k, _MM_HINT_T0);
  _mm_prefetch(k + 64, _MM_HINT_T0);
  _mm_prefetch(k1, _MM_HINT_T0);
  _mm_prefetch(k1 + 64, _MM_HINT_T0);
  _mm_prefetch(v, _MM_HINT_T0);
  _mm_prefetch(v + 64, _MM_HINT_T0);
  _mm_prefetch(v + 128, _MM_HINT_T0);
  _mm_prefetch(v + 192, _MM_HINT_T0);
}

// Scores of the tile's 32 tokens for kRows q heads (q16 rows `q_row` apart,
// scaled bf16): s[r][0] tokens 0-15, s[r][1] tokens 16-31. Two partial sums
// per vector (even and odd pairs) keep 4 * kRows chains in flight.
template <int kRows>
TRIDENT_AVX512 void PairScores(const PairTile& tile, const uint16_t* q16, int64_t q_row,
                               int32_t head_dim, const PairTile* next, __m512 (*s)[2]) {
  __m512 acc[kRows][2][2];
  for (int r = 0; r < kRows; ++r) {
    for (int h = 0; h < 2; ++h) acc[r][h][0] = acc[r][h][1] = _mm512_setzero_ps();
  }
  const int32_t pairs = head_dim / 2;
  for (int32_t i = 0; i < pairs; i += 2) {
    if (next != nullptr) PrefetchPairRows(*next, i);
    for (int e = 0; e < 2; ++e) {
      const uint16_t* row = tile.k + (i + e) * tile.k_row;
      const __m512bh k0 = LoadPairs(row);
      const __m512bh k1 = LoadPairs(row + 32);
      for (int r = 0; r < kRows; ++r) {
        const __m512bh q = BroadcastPair(q16 + r * q_row + 2 * (i + e));
        acc[r][0][e] = _mm512_dpbf16_ps(acc[r][0][e], q, k0);
        acc[r][1][e] = _mm512_dpbf16_ps(acc[r][1][e], q, k1);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    s[r][0] = _mm512_add_ps(acc[r][0][0], acc[r][0][1]);
    s[r][1] = _mm512_add_ps(acc[r][1][0], acc[r][1][1]);
  }
}

// acc[r][dims of kChunks vectors] = acc * corr[r] + sum_j p_r[2j, 2j + 1] .
// V[2j, 2j + 1] over the tile's n tokens; `v` is the tile's V at the first
// dim. Past n the weights are 0; the odd token of a last half pair is
// masked out of V so that stale cache bytes (NaN included) add nothing.
template <int kRows, int kChunks>
TRIDENT_AVX512 void PairPv(const uint16_t* v, int32_t head_dim, int32_t n,
                           const uint16_t* const* p16, const float* corr, float* acc,
                           int64_t acc_stride) {
  __m512 sum[kRows][kChunks];
  LoadScaledAcc<kRows, kChunks>(acc, acc_stride, corr, sum);
  const int64_t row = 2 * static_cast<int64_t>(head_dim);
  const int32_t whole = n / 2;
  for (int32_t j = 0; j < whole; ++j) {
    __m512bh vv[kChunks];
    for (int c = 0; c < kChunks; ++c) vv[c] = LoadPairs(v + j * row + 32 * c);
    for (int r = 0; r < kRows; ++r) {
      const __m512bh p = BroadcastPair(p16[r] + 2 * j);
      for (int c = 0; c < kChunks; ++c) sum[r][c] = _mm512_dpbf16_ps(sum[r][c], p, vv[c]);
    }
  }
  if (n % 2 != 0) {
    const __m512i even = _mm512_set1_epi32(0xffff);
    __m512bh vv[kChunks];
    for (int c = 0; c < kChunks; ++c) {
      vv[c] = (__m512bh)_mm512_and_si512(_mm512_loadu_si512(v + whole * row + 32 * c), even);
    }
    for (int r = 0; r < kRows; ++r) {
      const __m512bh p = BroadcastPair(p16[r] + 2 * whole);
      for (int c = 0; c < kChunks; ++c) sum[r][c] = _mm512_dpbf16_ps(sum[r][c], p, vv[c]);
    }
  }
  StoreAcc<kRows, kChunks>(sum, acc, acc_stride);
}

// P·V of kRows q heads over every dim, four 16-dim vectors at a time.
template <int kRows>
TRIDENT_AVX512 void PairPvRows(const uint16_t* v, int32_t head_dim, int32_t n,
                               const uint16_t* const* p16, const float* corr, float* acc,
                               int64_t acc_stride) {
  int32_t dim = 0;
  for (; dim + 64 <= head_dim; dim += 64) {
    PairPv<kRows, 4>(v + 2 * dim, head_dim, n, p16, corr, acc + dim, acc_stride);
  }
  switch ((head_dim - dim) / 16) {
    case 1:
      PairPv<kRows, 1>(v + 2 * dim, head_dim, n, p16, corr, acc + dim, acc_stride);
      break;
    case 2:
      PairPv<kRows, 2>(v + 2 * dim, head_dim, n, p16, corr, acc + dim, acc_stride);
      break;
    case 3:
      PairPv<kRows, 3>(v + 2 * dim, head_dim, n, p16, corr, acc + dim, acc_stride);
      break;
  }
}

// One tile for kRows q heads from g: scores, online softmax, the weights as
// bf16 (in place, the first 64 bytes of each p row), then P·V.
template <int kRows>
TRIDENT_AVX512 void PairRows(const SegmentArgs& a, const PairTile& tile, int32_t n, int32_t g,
                             const PairTile* next) {
  __m512 s[kRows][2];
  PairScores<kRows>(tile, a.scratch.q16 + static_cast<int64_t>(g) * a.head_dim, a.head_dim,
                    a.head_dim, next, s);
  const uint16_t* p16[kRows];
  for (int r = 0; r < kRows; ++r) {
    float* p = a.scratch.p + (g + r) * kTileTokens;
    SoftmaxRow(s[r], n, a.max + g + r, a.sum + g + r, p, a.scratch.corr + g + r);
    const __m512bh w = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + 16), _mm512_loadu_ps(p));
    _mm512_storeu_si512(p, (__m512i)w);
    p16[r] = reinterpret_cast<const uint16_t*>(p);
  }
  PairPvRows<kRows>(tile.v, a.head_dim, n, p16, a.scratch.corr + g, a.acc + g * a.acc_stride,
                    a.acc_stride);
}

// The segment [token_begin, token_end), token_begin a multiple of 32.
TRIDENT_AVX512 inline void PairSegment(const SegmentArgs& a) {
  for (int32_t g = 0; g < a.group && !a.resume; ++g) {
    a.max[g] = -std::numeric_limits<float>::infinity();
    a.sum[g] = 0.0f;
    std::fill_n(a.acc + g * a.acc_stride, a.head_dim, 0.0f);
  }
  // q * scale as bf16 rows of head_dim (pairs are adjacent already).
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int32_t g = 0; g < a.group; ++g) {
    const float* q = a.q + static_cast<int64_t>(g) * a.head_dim;
    uint16_t* out = a.scratch.q16 + static_cast<int64_t>(g) * a.head_dim;
    for (int32_t d = 0; d < a.head_dim; d += 16) {
      const __m256bh q16 = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(q + d), scale));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + d), (__m256i)q16);
    }
  }
  PairTile tile = PairTileAt(a, a.token_begin);
  for (int32_t t = a.token_begin; t < a.token_end; t += kTileTokens) {
    const int32_t n = std::min(kTileTokens, a.token_end - t);
    const PairTile next = PairTileAt(a, t + kTileTokens);
    for (int32_t g = 0; g < a.group; g += 4) {
      const PairTile* ahead = g == 0 && next.k != nullptr ? &next : nullptr;
      switch (std::min(4, a.group - g)) {
        case 4:
          PairRows<4>(a, tile, n, g, ahead);
          break;
        case 3:
          PairRows<3>(a, tile, n, g, ahead);
          break;
        case 2:
          PairRows<2>(a, tile, n, g, ahead);
          break;
        default:
          PairRows<1>(a, tile, n, g, ahead);
          break;
      }
    }
    tile = next;
  }
}

}  // namespace trident::kernels::cpu::decode_internal::avx512

#endif  // TRIDENT_KERNELS_CPU_DECODE_ATTENTION_DECODE_ATTENTION_AVX512_PAIRS_INL_H_
