// AVX-512 segment kernels: bf16 KV with AVX512-BF16 (vdpbf16ps) for q·K,
// f32 and f16 KV widened to fp32; P·V in fp32 FMA for every dtype of
// DecodeKvPacking::kRows (the kPairs kernel is
// decode_attention_avx512_pairs_inl.h).
//
// Every function here carries TRIDENT_AVX512 (per-function target
// attributes, no -m flags), so nothing compiled from this file runs unless
// the planner picked an AVX-512 path; inline functions from other headers stay
// baseline code.
//
// P·V for bf16 widens V to fp32 and FMAs (two integer ops per 16 elements)
// rather than pairing V rows for vdpbf16ps: that would round the softmax
// weights to bf16 (8 bits), and with a handful of vector ops per KV byte
// against a budget of tens per byte the kernel is bandwidth-bound either way
// (see the benchmark's of_ceiling).

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/decode_attention/decode_attention_avx512_inl.h"
#include "kernels/cpu/decode_attention/decode_attention_avx512_pairs_inl.h"
#include "kernels/cpu/decode_attention/decode_attention_internal.h"

namespace trident::kernels::cpu::decode_internal {
namespace {

using avx512::BlockLoop;
using avx512::Bf16Scores;
using avx512::WideScores;

// Instantiated for the common head dims (constant row offsets and unrolled
// dim loops) and for any multiple of 16.
template <template <int> class Scores>
TRIDENT_AVX512 void ByHeadDim(const SegmentArgs& a) {
  switch (a.head_dim) {
    case 64:
      return BlockLoop<Scores<64>>(a);
    case 128:
      return BlockLoop<Scores<128>>(a);
    case 256:
      return BlockLoop<Scores<256>>(a);
    default:
      return BlockLoop<Scores<0>>(a);
  }
}

template <int kD>
using F32Scores = WideScores<float, kD>;
template <int kD>
using F16Scores = WideScores<avx512::Half, kD>;

TRIDENT_AVX512 void SegmentF32(const SegmentArgs& a) { ByHeadDim<F32Scores>(a); }
TRIDENT_AVX512 void SegmentF16(const SegmentArgs& a) { ByHeadDim<F16Scores>(a); }
TRIDENT_AVX512 void SegmentBf16(const SegmentArgs& a) { ByHeadDim<Bf16Scores>(a); }
TRIDENT_AVX512 void SegmentBf16Pairs(const SegmentArgs& a) { avx512::PairSegment(a); }

}  // namespace

IsaKernels Avx512Bf16Kernels() {
  IsaKernels k;
  k.f32 = SegmentF32;
  k.bf16 = SegmentBf16;
  k.f16 = SegmentF16;
  k.bf16_pairs = SegmentBf16Pairs;
  return k;
}

}  // namespace trident::kernels::cpu::decode_internal
