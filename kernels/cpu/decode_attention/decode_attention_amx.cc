// AMX-BF16 segment kernel for bf16 KV: q·K on tiles, the rest (online
// softmax, P·V in fp32 FMA, f32/f16 KV, head_dim not a multiple of 32) from
// the AVX-512 kernels.
//
// Scores come out transposed, without repacking K: for 16 tokens and one
// 32-dim chunk,
//
//   C[t][g] += sum_i A[t][2i..2i+1] . B[i][g][0..1]        (tdpbf16ps)
//
// where A is 16 K rows of the chunk loaded straight from the cache (row
// stride head_dim * 2 bytes) and B is q^T in VNNI form, B[i][g] = the pair
// (q[g][32c + 2i], q[g][32c + 2i + 1]), packed once per segment. C is
// [token][q head]: the softmax runs over 16 q heads per vector and P·V reads
// its weights with a token stride of 16 floats.
//
// Tiles (all 16 rows x 64 bytes): tmm0/1 scores of tokens 0-15/16-31 of the
// tile, tmm2/3 the matching K rows, tmm4-7 the q chunks. When the q chunks of
// all column groups fit in four tiles (head_dim * ceil(group / 16) <= 128)
// they stay loaded for the whole segment; otherwise tmm4 is reloaded per
// chunk from L1.

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu/decode_attention/decode_attention_avx512_inl.h"
#include "kernels/cpu/decode_attention/decode_attention_internal.h"

#define TRIDENT_AMX \
  __attribute__((target("avx512f,avx512bf16,avx2,fma,f16c,amx-tile,amx-bf16")))

namespace trident::kernels::cpu::decode_internal {
namespace {

using avx512::Bf16;

#ifdef TRIDENT_DECODE_ATTENTION_AMX_EMULATION
// Test-only (:decode_attention_amx_emulation): scalar stand-ins for the tile
// instructions, so the packing, padding and [token][q head] indexing of this
// file run on CPUs without AMX. Tiles are 16 rows x 64 bytes, as configured.
struct EmulatedTiles {
  alignas(64) unsigned char rows[8][16][64];
};
thread_local EmulatedTiles tiles;

void EmulatedLoad(int tile, const void* base, long stride) {
  for (int r = 0; r < 16; ++r) {
    std::memcpy(tiles.rows[tile][r], static_cast<const char*>(base) + r * stride, 64);
  }
}

void EmulatedStore(int tile, void* base, long stride) {
  for (int r = 0; r < 16; ++r) {
    std::memcpy(static_cast<char*>(base) + r * stride, tiles.rows[tile][r], 64);
  }
}

float Bf16At(int tile, int row, int index) {
  uint16_t bits;
  std::memcpy(&bits, tiles.rows[tile][row] + 2 * index, 2);
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// C[m][n] += sum_k A[m][2k] B[k][2n] + A[m][2k + 1] B[k][2n + 1].
void EmulatedDpbf16ps(int c, int a, int b) {
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 16; ++n) {
      float sum;
      std::memcpy(&sum, tiles.rows[c][m] + 4 * n, 4);
      for (int k = 0; k < 16; ++k) {
        sum += Bf16At(a, m, 2 * k) * Bf16At(b, k, 2 * n) +
               Bf16At(a, m, 2 * k + 1) * Bf16At(b, k, 2 * n + 1);
      }
      std::memcpy(tiles.rows[c][m] + 4 * n, &sum, 4);
    }
  }
}

#undef _tile_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbf16ps
#define _tile_loadd(tile, base, stride) EmulatedLoad(tile, base, stride)
#define _tile_stored(tile, base, stride) EmulatedStore(tile, base, stride)
#define _tile_zero(tile) std::memset(tiles.rows[tile], 0, sizeof(tiles.rows[tile]))
#define _tile_dpbf16ps(c, a, b) EmulatedDpbf16ps(c, a, b)
void LoadTileConfig(const void*) {}
void ReleaseTiles() {}
#else
TRIDENT_AMX inline void LoadTileConfig(const void* config) { _tile_loadconfig(config); }
TRIDENT_AMX inline void ReleaseTiles() { _tile_release(); }
#endif  // TRIDENT_DECODE_ATTENTION_AMX_EMULATION

// The `ldtilecfg` operand: palette 1, every tile used as 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

TRIDENT_AMX void BeginRun() {
  TileConfig config;
  for (int i = 0; i < 8; ++i) {
    config.colsb[i] = 64;
    config.rows[i] = 16;
  }
  LoadTileConfig(&config);
}

TRIDENT_AMX void EndRun() { ReleaseTiles(); }

// GCC's tileloadd asm names no memory input, so stores it must observe (the
// packed q, the padded K copy) are fenced from it for the compiler.
inline void CompilerBarrier() { __asm__ volatile("" ::: "memory"); }

constexpr int kResidentQTiles = 4;
constexpr int kPackedChunkElems = 16 * 16 * 2;  // One B tile: 16 dim pairs x 16 q heads x 2.

template <int kD>
struct AmxScores {
  using Elem = Bf16;
  static constexpr int kHeadDim = kD;

  static int32_t HeadDim(const SegmentArgs& a) { return kD > 0 ? kD : a.head_dim; }
  static int32_t Chunks(const SegmentArgs& a) { return HeadDim(a) / 32; }
  static int32_t ColumnGroups(const SegmentArgs& a) { return (a.group + 15) / 16; }
  static bool Resident(const SegmentArgs& a) {
    return Chunks(a) * ColumnGroups(a) <= kResidentQTiles;
  }

  // Packs q * scale as bf16 B tiles, [column group][chunk][dim pair][16 q
  // heads][2] (q heads past the group are zero), and loads them into
  // tmm4.. when they fit.
  TRIDENT_AMX static void Prepare(const SegmentArgs& a) {
    const int32_t d = HeadDim(a);
    const int32_t chunks = Chunks(a);
    for (int32_t cg = 0; cg < ColumnGroups(a); ++cg) {
      for (int32_t c = 0; c < chunks; ++c) {
        uint16_t* tile = a.scratch.q16 + (cg * chunks + c) * kPackedChunkElems;
        for (int32_t i = 0; i < 16; ++i) {
          for (int32_t col = 0; col < 16; ++col) {
            const int32_t g = cg * 16 + col;
            for (int32_t e = 0; e < 2; ++e) {
              const float x = g < a.group ? a.q[g * d + 32 * c + 2 * i + e] * a.scale : 0.0f;
              tile[(i * 16 + col) * 2 + e] = FloatToBf16Bits(x);
            }
          }
        }
      }
    }
    CompilerBarrier();
    if (Resident(a)) {
      const int32_t tiles = chunks * ColumnGroups(a);
      const uint16_t* q16 = a.scratch.q16;
      if (tiles > 0) _tile_loadd(4, q16, 64);
      if (tiles > 1) _tile_loadd(5, q16 + kPackedChunkElems, 64);
      if (tiles > 2) _tile_loadd(6, q16 + 2 * kPackedChunkElems, 64);
      if (tiles > 3) _tile_loadd(7, q16 + 3 * kPackedChunkElems, 64);
    }
  }

  static uint16_t FloatToBf16Bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }

  // C[t][col] for the tile's n tokens and column group cg into p rows of 16.
  TRIDENT_AMX static void TileScores(const SegmentArgs& a, const Bf16* k, int32_t n,
                                     int32_t cg, float* p) {
    const int32_t d = HeadDim(a);
    const int32_t chunks = Chunks(a);
    const int64_t stride = static_cast<int64_t>(d) * 2;
    const bool two = n > 16;
    // Partial halves come from a copy, so tile loads never read past the
    // tile's tokens (the next rows may belong to another head or be unmapped).
    const Bf16* lo = k;
    const Bf16* hi = k + 16 * static_cast<int64_t>(d);
    if (n < 16) {
      std::memcpy(a.scratch.pad, k, n * stride);
      lo = reinterpret_cast<const Bf16*>(a.scratch.pad);
    } else if (two && n < 32) {
      std::memcpy(a.scratch.pad, hi, (n - 16) * stride);
      hi = reinterpret_cast<const Bf16*>(a.scratch.pad);
    }
    CompilerBarrier();
    _tile_zero(0);
    _tile_zero(1);
    const bool resident = Resident(a);
    for (int32_t c = 0; c < chunks; ++c) {
      _tile_loadd(2, lo + 32 * c, stride);
      if (two) _tile_loadd(3, hi + 32 * c, stride);
      const int32_t index = cg * chunks + c;
      switch (resident ? index : -1) {
        case 0:
          _tile_dpbf16ps(0, 2, 4);
          if (two) _tile_dpbf16ps(1, 3, 4);
          break;
        case 1:
          _tile_dpbf16ps(0, 2, 5);
          if (two) _tile_dpbf16ps(1, 3, 5);
          break;
        case 2:
          _tile_dpbf16ps(0, 2, 6);
          if (two) _tile_dpbf16ps(1, 3, 6);
          break;
        case 3:
          _tile_dpbf16ps(0, 2, 7);
          if (two) _tile_dpbf16ps(1, 3, 7);
          break;
        default:
          _tile_loadd(4, a.scratch.q16 + index * kPackedChunkElems, 64);
          _tile_dpbf16ps(0, 2, 4);
          if (two) _tile_dpbf16ps(1, 3, 4);
          break;
      }
    }
    _tile_stored(0, p, 64);
    if (two) _tile_stored(1, p + 16 * 16, 64);
  }

  // Online softmax over the [token][16 q heads] scores of one column group.
  TRIDENT_AMX static void Softmax(const SegmentArgs& a, int32_t n, int32_t cg, float* p) {
    const int32_t cols = std::min(16, a.group - cg * 16);
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
    const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    const __m512 old_max = _mm512_mask_loadu_ps(neg_inf, mask, a.max + cg * 16);
    __m512 tile_max = neg_inf;
    for (int32_t t = 0; t < n; ++t) tile_max = _mm512_max_ps(tile_max, _mm512_loadu_ps(p + 16 * t));
    const __m512 new_max = _mm512_max_ps(old_max, tile_max);
    const __mmask16 started = _mm512_cmp_ps_mask(old_max, neg_inf, _CMP_NEQ_OQ);
    const __m512 corr =
        _mm512_maskz_mov_ps(started, avx512::Exp(_mm512_sub_ps(old_max, new_max)));
    __m512 sum = _mm512_setzero_ps();
    for (int32_t t = 0; t < n; ++t) {
      const __m512 e = avx512::Exp(_mm512_sub_ps(_mm512_loadu_ps(p + 16 * t), new_max));
      _mm512_storeu_ps(p + 16 * t, e);
      sum = _mm512_add_ps(sum, e);
    }
    const __m512 old_sum = _mm512_maskz_loadu_ps(mask, a.sum + cg * 16);
    _mm512_mask_storeu_ps(a.sum + cg * 16, mask, _mm512_fmadd_ps(old_sum, corr, sum));
    _mm512_mask_storeu_ps(a.max + cg * 16, mask, new_max);
    _mm512_mask_storeu_ps(a.scratch.corr + cg * 16, mask, corr);
  }

  TRIDENT_AMX static void Tile(const SegmentArgs& a, const Bf16* k, int32_t n) {
    for (int32_t cg = 0; cg < ColumnGroups(a); ++cg) {
      float* p = a.scratch.p + cg * 16 * kTileTokens;
      TileScores(a, k, n, cg, p);
      Softmax(a, n, cg, p);
    }
  }

  TRIDENT_AMX static void Pv(const SegmentArgs& a, const Bf16* v, int32_t n) {
    const float* p = a.scratch.p;
    avx512::PvGroup<kD>(
        a, v, n, [p](int32_t g) { return p + (g / 16) * 16 * kTileTokens + g % 16; }, 16);
  }
};

TRIDENT_AMX void SegmentBf16(const SegmentArgs& a) {
  switch (a.head_dim) {
    case 64:
      return avx512::BlockLoop<AmxScores<64>>(a);
    case 128:
      return avx512::BlockLoop<AmxScores<128>>(a);
    case 256:
      return avx512::BlockLoop<AmxScores<256>>(a);
    default:
      // A 16-dim tail would make the last K tile read the next row.
      if (a.head_dim % 32 != 0) return avx512::BlockLoop<avx512::Bf16Scores<0>>(a);
      return avx512::BlockLoop<AmxScores<0>>(a);
  }
}

}  // namespace

bool RequestAmxPermission() {
#ifdef TRIDENT_DECODE_ATTENTION_AMX_EMULATION
  return true;
#endif
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

IsaKernels AmxKernels() {
  IsaKernels k = Avx512Bf16Kernels();
  k.bf16 = SegmentBf16;
  k.begin_run = BeginRun;
  k.end_run = EndRun;
  return k;
}

}  // namespace trident::kernels::cpu::decode_internal
