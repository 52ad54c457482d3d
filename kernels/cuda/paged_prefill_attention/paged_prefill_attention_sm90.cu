// Hopper's prefill attention for head_dim 128 and the bf16 cache: the
// contract of paged_prefill_attention.h, with warpgroup MMA (wgmma) and the
// tensor copy engine (TMA) instead of mma.sync and cp.async.
//
// One CTA of three warpgroups takes 128 query rows of one q head and walks
// the sequence's KV in tiles of 128 keys. The first warpgroup (the producer,
// few registers) gathers tiles through the block table into three stages of
// shared memory: a TMA box per (block, K or V, half of the dims), so a
// 16-token block is four instructions, issued by one thread of each producer
// warp in turn (a tile of 16-token blocks is 32 boxes, and one thread issuing
// them all held the consumers back); only a context's last, partial block
// goes by cp.async (zero-filled past its end). Each of the other two
// warpgroups (the consumers, 64 query rows each, most of the registers)
// loads its rows of Q into registers once, as wgmma's A fragments, then
// computes S = Q K^T with K read from shared memory, keeps the softmax
// online in fp32 registers, and accumulates O += P V with P taken from
// registers (the accumulator's fragment is the A operand's) and V read
// MN-major from shared memory. Shared-memory barriers hand stages between
// them: a stage is full when the producer's copies into it have landed,
// empty when both consumers are done with it. The consumers wait on no
// global load after Q's, and take turns on the tensor cores (named
// barriers): one issues its P V and next S while the other takes its
// softmax.
//
// Without the tensor copy engine, and over the FP8 cache, two stages hold
// the tiles, Q stays in shared memory and the consumers work on their own
// (Consume).
//
// Shared memory holds Q (but for the tensor copy engine's consumers, which
// keep it in registers and leave its space unused), K and V in wgmma's
// 128-byte-swizzled layout (see
// SwizzledOffset), which the TMA writes directly. Where the tensor map does
// not apply (a block size that is not a multiple of 8 dividing 128, blocks
// not whole rows apart), every chunk goes by cp.async into the same layout.

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/paged_prefill_attention/paged_prefill_attention_kernel.h"
#include "kernels/cuda/paged_prefill_attention/prefill_device.h"
#include "kernels/cuda/wgmma/tensor_map.h"
#include "kernels/cuda/wgmma/wgmma_device.h"

namespace trident::kernels::cuda::internal {
namespace {

using prefill::CpAsync16;
using prefill::CpAsyncWaitAll;
using prefill::PackBf16;
using prefill::SmemAddr;
using prefill::UpdateRowMax;

constexpr int kHeadDim = 128;
constexpr int kBlockM = 128;  // Query rows per CTA: 64 per warpgroup.
// Keys per KV tile: on an H200 they ran 3-16% faster than 64-key tiles in
// two to four stages.
constexpr int kBlockN = 128;
// Stages of (K, V) tiles: three where the tensor copy engine fills them (the
// consumers take turns, so they run half a tile apart and a stage is
// released later; three stages ran 5% faster at 16k tokens than two without
// turns), two over cp.async and over the FP8 cache (whose staging buffers
// leave no room for a third).
constexpr int kTmaStages = 3;
constexpr int kPlainStages = 2;
constexpr int kKvBytes = kBlockN * kHeadDim * 2;  // One of K or V.
constexpr int kChunks = kBlockN * kHeadDim / 8;   // 16-byte chunks of K (or V).
constexpr int kThreads = 384;                     // A producer and two consumer warpgroups.
constexpr int kLoaders = 128;
// Producer threads that issue a tile's TMA boxes, one a warp: issuer i takes
// blocks i, i + kIssuers, ... On an H200 at 16k tokens in 16-token blocks,
// one issuer reached 412 TFLOP/s, two 505, four 527 (eight, two a warp, no
// more).
constexpr int kIssuers = 4;
constexpr int kIssuerStride = kLoaders / kIssuers;
constexpr int kQBytes = kBlockM * kHeadDim * 2;  // 32 KiB.
constexpr int kSmemLimit = 227 * 1024;
// The block table goes to shared memory when it fits, up to this size (8192
// blocks).
constexpr int kMaxTableBytes = 32 * 1024;
// Registers per thread after the hand-over (setmaxnreg). The CTA holds what
// its launch gave it, 384 x 168 (__launch_bounds__(384, 1)): the split must
// not ask for more, or the consumers' setmaxnreg.inc waits forever.
constexpr int kLaunchRegisters = 168;
constexpr int kProducerRegisters = 24;
constexpr int kConsumerRegisters = 240;
static_assert(128 * kProducerRegisters + 256 * kConsumerRegisters <= 384 * kLaunchRegisters);
// Bytes between the 8-row atoms of the swizzled layout (below).
constexpr uint32_t kAtomStride = 1024;

// How the producer fills a stage: cp.async alone, the tensor copy engine
// (with cp.async for a context's last partial block), or, over the FP8
// cache, the tensor copy engine into a staging buffer that the producer
// dequantizes into the same bf16 tiles (V transposed: K-major for P V).
enum class Load { kCpAsync, kTma, kFp8 };

__host__ __device__ constexpr int StagesOf(Load load) {
  return load == Load::kTma ? kTmaStages : kPlainStages;
}

// Q, then the stages of (K, V), then the stages' full and empty barriers,
// then (when it fits) the sequence's block table.
__host__ __device__ constexpr int TilesBytes(int stages) { return kQBytes + stages * 2 * kKvBytes; }
__host__ __device__ constexpr int BarrierBytes(int stages) { return stages * 2 * 8; }
__host__ __device__ constexpr int SmemBytes(Load load) {
  return TilesBytes(StagesOf(load)) + BarrierBytes(StagesOf(load));
}
// The largest block table (16-byte multiple) that fits beside the rest.
constexpr int TableBytesLimit(Load load) {
  return kMaxTableBytes < (kSmemLimit - SmemBytes(load)) / 16 * 16
             ? kMaxTableBytes
             : (kSmemLimit - SmemBytes(load)) / 16 * 16;
}
static_assert(TableBytesLimit(Load::kTma) >= 2048, "a 512-block table fits beside 3 stages");
static_assert(SmemBytes(Load::kCpAsync) + kMaxTableBytes <= kSmemLimit, "shared memory fits");

// The FP8 cache's raw bytes of a tile: K rows (128 bytes a token) then V's
// transposed 16-token groups (2 KiB each), both whole 128-byte rows of the
// cache, in two staging buffers; then each buffer's K and V scales. After
// them, the stages' barriers and the two staging buffers' barriers. The
// block table stays in global memory.
constexpr int kFp8StagingBytes = 2 * kBlockN * kHeadDim;
constexpr int kFp8ScaleBytes = 2 * kBlockN * 4;
constexpr int kFp8BarrierOffset =
    TilesBytes(kPlainStages) + 2 * kFp8StagingBytes + 2 * kFp8ScaleBytes;
constexpr int kFp8SmemBytes = kFp8BarrierOffset + BarrierBytes(kPlainStages) + 2 * 8;
static_assert(kFp8SmemBytes <= kSmemLimit, "FP8 shared memory fits");

// Registers per thread after setmaxnreg. The FP8 producer dequantizes, so it
// keeps more.
constexpr int kFp8ProducerRegisters = 56;
constexpr int kFp8ConsumerRegisters = 224;
static_assert(128 * kFp8ProducerRegisters + 256 * kFp8ConsumerRegisters <= 384 * kLaunchRegisters);
__host__ __device__ constexpr int ProducerRegisters(Load load) {
  return load == Load::kFp8 ? kFp8ProducerRegisters : kProducerRegisters;
}
__host__ __device__ constexpr int ConsumerRegisters(Load load) {
  return load == Load::kFp8 ? kFp8ConsumerRegisters : kConsumerRegisters;
}

__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The 128-byte-swizzled layout of a tile of `rows` rows (queries or keys) x
// 128 dims, for Q, K and V alike: two atoms of rows x 64 dims, each row's
// 128 bytes with chunk c at c ^ (row % 8) (wgmma_device's Swizzle128Offset).
// Q and K are read K-major, V MN-major; atoms of 8 rows are 1024 bytes apart
// either way (kAtomStride). cp.async maps 16 threads to a row's 256 bytes
// (coalesced), and 8 threads write one 128-byte row of shared memory (no
// bank conflict).
struct SwizzledChunk {
  int row;
  int col;  // In units of 8 dims.
};
__device__ __forceinline__ SwizzledChunk SwizzledChunkOf(int i) { return {i / 16, i % 16}; }
template <int kRows>
__device__ __forceinline__ uint32_t SwizzledOffset(SwizzledChunk c) {
  return (c.col / 8) * (kRows * 128) + wgmma::Swizzle128Offset(c.row, c.col % 8);
}

struct CtaWork {
  int seq;
  int head;
  int kv_head;
  int m0;
  int rows;
  int query_start;
  int first_row_pos;
  int kv_end;
};

// Gathers keys [n0, n0 + kBlockN) of the CTA's kv head into sk (K-major) and
// sv (MN-major); keys at or past kv_end become zeros. `table` is the
// sequence's block table; `t` the producer thread (0 .. kLoaders - 1).
__device__ __forceinline__ void LoadKvTile(const PagedPrefillParams& p, const int32_t* table,
                                           const CtaWork& w, int n0, int t, unsigned char* sk,
                                           unsigned char* sv, int first_row = 0) {
  const __nv_bfloat16* const kv = static_cast<const __nv_bfloat16*>(p.kv_base);
#pragma unroll 4
  for (int pass = 0; pass < kChunks / kLoaders; ++pass) {
    const SwizzledChunk c = SwizzledChunkOf(pass * kLoaders + t);
    if (c.row < first_row) continue;
    const int pos = n0 + c.row;
    const bool valid = pos < w.kv_end;
    int64_t offset = 0;
    if (valid) {
      const int block_index = pos / p.block_size;
      const int slot = pos - block_index * p.block_size;
      offset = static_cast<int64_t>(table[block_index]) * p.block_stride_elems +
               (static_cast<int64_t>(w.kv_head) * p.block_size + slot) * kHeadDim + c.col * 8;
    }
    const uint32_t at = SwizzledOffset<kBlockN>(c);
    CpAsync16(SmemAddr(sk + at), kv + offset, valid);
    CpAsync16(SmemAddr(sv + at), kv + (valid ? offset + p.value_offset_elems : 0), valid);
  }
}

__device__ __forceinline__ void LoadQ(const PagedPrefillParams& p, const CtaWork& w, int t,
                                      unsigned char* sq) {
  const __nv_bfloat16* const q = static_cast<const __nv_bfloat16*>(p.q);
#pragma unroll 4
  for (int pass = 0; pass < kBlockM * kHeadDim / 8 / kLoaders; ++pass) {
    const SwizzledChunk c = SwizzledChunkOf(pass * kLoaders + t);
    const bool valid = c.row < w.rows;
    const __nv_bfloat16* src =
        valid ? q + static_cast<int64_t>(w.query_start + w.m0 + c.row) * p.q_stride +
                    static_cast<int64_t>(w.head) * kHeadDim + c.col * 8
              : q;
    CpAsync16(SmemAddr(sq + SwizzledOffset<kBlockM>(c)), src, valid);
  }
}

// The softmax statistics of a consumer thread's two rows (g and g + 8 of its
// warp).
struct Softmax {
  float row_max[2];  // In log2 units (scores * scale_log2).
  float row_sum[2];  // This thread's share; the quad sums at the end.
};

// Masks S (64 rows x kBlockN keys, the m64n128 accumulator fragment) where
// keys pass a row's position, updates the running max and sum, rescales o,
// and turns S into probabilities in place.
__device__ __forceinline__ void OnlineSoftmax(float (&s)[kBlockN / 2], float (&o)[64], Softmax& sm,
                                              bool masked, int n0, int pos0, float scale_log2) {
  const int t = threadIdx.x % 4;
  if (masked) {
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
      const int key = n0 + j * 8 + 2 * t;
      if (key > pos0) s[4 * j] = -INFINITY;
      if (key + 1 > pos0) s[4 * j + 1] = -INFINITY;
      if (key > pos0 + 8) s[4 * j + 2] = -INFINITY;
      if (key + 1 > pos0 + 8) s[4 * j + 3] = -INFINITY;
    }
  }
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
    tile_max[0] = fmaxf(tile_max[0], fmaxf(s[4 * j], s[4 * j + 1]));
    tile_max[1] = fmaxf(tile_max[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
  float shift[2];
  float alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    shift[h] = UpdateRowMax(tile_max[h], scale_log2, sm.row_max[h], alpha[h]);
  }
  float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e / 2;
      s[4 * j + e] = Exp2(fmaf(s[4 * j + e], scale_log2, -shift[h]));
      tile_sum[h] += s[4 * j + e];
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) sm.row_sum[h] = sm.row_sum[h] * alpha[h] + tile_sum[h];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    o[4 * j] *= alpha[0];
    o[4 * j + 1] *= alpha[0];
    o[4 * j + 2] *= alpha[1];
    o[4 * j + 3] *= alpha[1];
  }
}

// A P fragment for P V: the A operand of keys 16 kk .. 16 kk + 15 is S's
// accumulators of the 8-key column blocks 2 kk and 2 kk + 1.
using PFragment = uint32_t[kBlockN / 16][4];

// The products below take a tile's base descriptor plus each step's offset
// (wgmma::DescriptorAt), not a descriptor built from each step's address: the
// built ones were a chain of four integer operations and a move to a uniform
// register per wgmma, all while the issuing consumer held its turn (ncu's
// source view at 8k: 27% of a consumer's samples fell between its first and
// last wgmma of a turn).

// Bytes from a K-major swizzled operand of kRows rows to its k16 step i: two
// atoms of 64 dims kRows * 128 bytes apart, 32 bytes a step within one.
template <int kRows>
__device__ __forceinline__ uint32_t KStepBytes(int i) {
  return (i / 4) * (kRows * 128) + (i % 4) * 32;
}

// S = Q K^T for a warpgroup's 64 rows (issued, not committed).
__device__ __forceinline__ void IssueScores(const unsigned char* sq_wg, const unsigned char* sk,
                                            float (&s)[kBlockN / 2]) {
  const uint64_t q = wgmma::Swizzle128Descriptor(sq_wg, kAtomStride);
  const uint64_t k = wgmma::Swizzle128Descriptor(sk, kAtomStride);
#pragma unroll
  for (int i = 0; i < kHeadDim / 16; ++i) {
    wgmma::MmaM64N128K16Bf16(wgmma::DescriptorAt(q, KStepBytes<kBlockM>(i)),
                             wgmma::DescriptorAt(k, KStepBytes<kBlockN>(i)), s, i > 0);
  }
}
// Q's rows of a consumer thread as wgmma's A fragments, one per 16 dims:
// qa[k] holds dims 16 k + 2 t, + 1 and 16 k + 8 + 2 t, + 1 (t = lane % 4) of
// rows g and g + 8 of the warp's 16 (g = lane / 4), as P's fragments do keys.
using QFragment = uint32_t[kHeadDim / 16][4];

// Loads a consumer thread's QFragment from global memory (zeros past the
// tile's rows); row0 is its first row in the tile.
__device__ __forceinline__ void LoadQRegisters(const PagedPrefillParams& p, const CtaWork& w,
                                               int row0, QFragment& qa) {
  const int t = threadIdx.x % 4;
  const __nv_bfloat16* const q = static_cast<const __nv_bfloat16*>(p.q);
  const uint32_t* rows[2];
  bool live[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    live[h] = row0 + 8 * h < w.rows;
    rows[h] = reinterpret_cast<const uint32_t*>(
        q + (live[h] ? static_cast<int64_t>(w.query_start + w.m0 + row0 + 8 * h) * p.q_stride +
                           static_cast<int64_t>(w.head) * kHeadDim + 2 * t
                     : 0));
  }
#pragma unroll
  for (int k = 0; k < kHeadDim / 16; ++k) {
    qa[k][0] = live[0] ? rows[0][8 * k] : 0u;
    qa[k][1] = live[1] ? rows[1][8 * k] : 0u;
    qa[k][2] = live[0] ? rows[0][8 * k + 4] : 0u;
    qa[k][3] = live[1] ? rows[1][8 * k + 4] : 0u;
  }
}

// S = Q K^T with Q from registers (issued, not committed). Shared memory
// then feeds K, V and the copies into the stages, not Q too: on an H200 this
// ran 2.0-2.3% faster at 4k-16k tokens and 6-8% at 512-1k than Q read from
// shared memory by every S, the stages' copies in the same memory meanwhile.
__device__ __forceinline__ void IssueScoresRegQ(const QFragment& qa, const unsigned char* sk,
                                                float (&s)[kBlockN / 2]) {
  const uint64_t k = wgmma::Swizzle128Descriptor(sk, kAtomStride);
#pragma unroll
  for (int i = 0; i < kHeadDim / 16; ++i) {
    wgmma::MmaM64N128K16Bf16RegA<false>(qa[i], wgmma::DescriptorAt(k, KStepBytes<kBlockN>(i)), s,
                                        i > 0);
  }
}

// O += P V (issued, not committed). kVKMajor: V is stored transposed (rows
// of dims, keys along the 128-byte swizzled rows, as K is), which B reads
// K-major; otherwise dims 0-63 and 64-127 are two atoms, kBlockN rows of 128
// bytes apart (the descriptor's leading offset).
template <bool kVKMajor>
__device__ __forceinline__ void IssuePv(const PFragment& pa, const unsigned char* sv,
                                        float (&o)[64]) {
  const uint64_t v = kVKMajor ? wgmma::Swizzle128Descriptor(sv, kAtomStride)
                              : wgmma::Swizzle128Descriptor(sv, kAtomStride, kBlockN * 128);
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    if constexpr (kVKMajor) {
      wgmma::MmaM64N128K16Bf16RegA<false>(pa[kk], wgmma::DescriptorAt(v, KStepBytes<kHeadDim>(kk)),
                                          o, true);
    } else {
      wgmma::MmaM64N128K16Bf16RegA(pa[kk], wgmma::DescriptorAt(v, kk * 2048), o, true);
    }
  }
}
// P as bf16 A fragments, from the probabilities in S's accumulators.
__device__ __forceinline__ void PackP(const float (&s)[kBlockN / 2], PFragment& pa) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    pa[kk][0] = PackBf16(s[8 * kk], s[8 * kk + 1]);
    pa[kk][1] = PackBf16(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = PackBf16(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = PackBf16(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// The consumers take turns on the tensor cores (FA3's warp scheduler
// barriers): a turn issues P V of the tile before and S of this tile back to
// back, then passes, so one consumer's products run while the other takes
// its softmax, instead of both softmaxes at once. Named barrier 2 + c is
// consumer c's turn; it completes when c waits on it (128 threads) and the
// other consumer has passed (128 more).
constexpr int kTurnBarrier = 2;
__device__ __forceinline__ void TakeTurn(int c) {
  asm volatile("bar.sync %0, 256;" ::"r"(kTurnBarrier + c) : "memory");
}
__device__ __forceinline__ void PassTurn(int c) {
  asm volatile("bar.arrive %0, 256;" ::"r"(kTurnBarrier + 1 - c) : "memory");
}

__device__ __forceinline__ void StoreOutput(const PagedPrefillParams& p, const CtaWork& w,
                                            const float (&o)[64], Softmax& sm, int row0) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    sm.row_sum[h] += __shfl_xor_sync(0xffffffffu, sm.row_sum[h], 1);
    sm.row_sum[h] += __shfl_xor_sync(0xffffffffu, sm.row_sum[h], 2);
  }
  const float inv0 = sm.row_sum[0] > 0.0f ? 1.0f / sm.row_sum[0] : 0.0f;
  const float inv1 = sm.row_sum[1] > 0.0f ? 1.0f / sm.row_sum[1] : 0.0f;
  const int t = threadIdx.x % 4;
  __nv_bfloat16* const out0 = static_cast<__nv_bfloat16*>(p.out) +
                              static_cast<int64_t>(w.query_start + w.m0 + row0) * p.out_stride +
                              static_cast<int64_t>(w.head) * kHeadDim + 2 * t;
  __nv_bfloat16* const out1 = out0 + 8 * p.out_stride;
  const bool live0 = row0 < w.rows;
  const bool live1 = row0 + 8 < w.rows;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    if (live0) {
      *reinterpret_cast<uint32_t*>(out0 + 8 * j) = PackBf16(o[4 * j] * inv0, o[4 * j + 1] * inv0);
    }
    if (live1) {
      *reinterpret_cast<uint32_t*>(out1 + 8 * j) =
          PackBf16(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
    }
  }
}

struct Stages {
  unsigned char* smem;
  uint64_t* full;   // [stages]: the stage's tile has landed.
  uint64_t* empty;  // [stages]: both consumers are done with the stage's tile.
  __device__ unsigned char* k(int stage) const { return smem + kQBytes + stage * 2 * kKvBytes; }
  __device__ unsigned char* v(int stage) const { return k(stage) + kKvBytes; }
};

// The producer warpgroup: Q, then KV tile `it` into stage it % stages once
// the tile before it there has been consumed. kTma: whole blocks of the
// cache come by the tensor copy engine (kv_map), the rest (a context's last
// partial block) by cp.async; otherwise everything by cp.async.
template <bool kTma>
__device__ __forceinline__ void ProduceBf16(const PagedPrefillParams& p, const CUtensorMap* kv_map,
                                            const int32_t* table, const CtaWork& w, int num_n_tiles,
                                            const Stages& st) {
  constexpr int kStages = kTma ? kTmaStages : kPlainStages;
  const int t = threadIdx.x;
  if constexpr (!kTma) LoadQ(p, w, t, st.smem);  // With the copy engine, Q goes to registers.
  for (int it = 0; it < num_n_tiles; ++it) {
    const int stage = it % kStages;
    const int use = it / kStages;  // Tiles the stage held before this one.
    if (use > 0) wgmma::BarrierWait(&st.empty[stage], (use - 1) & 1);
    const int n0 = it * kBlockN;
    if constexpr (kTma) {
      // Rows [0, whole) of the tile are whole blocks before kv_end: one box
      // of block_size rows x 64 dims per block, K and V, two dim halves.
      const int bs = p.block_size;
      const int whole = min(kBlockN, max(0, (w.kv_end - n0) / bs * bs));
      if (t % kIssuerStride == 0) {
        // The first issuer sets the stage's bytes; the others' boxes may
        // land before it does, which the barrier allows (its phase also
        // waits for every producer thread's arrival).
        const int issuer = t / kIssuerStride;
        if (issuer == 0) {
          wgmma::BarrierArriveExpectBytes(&st.full[stage], whole * kHeadDim * 2 * 2);
        }
        const int64_t rows_per_block = p.block_stride_elems / kHeadDim;
        for (int r = issuer * bs; r < whole; r += kIssuers * bs) {
          const int32_t k_row = static_cast<int32_t>(table[(n0 + r) / bs] * rows_per_block +
                                                     static_cast<int64_t>(w.kv_head) * bs);
          const int32_t v_row = k_row + static_cast<int32_t>(p.value_offset_elems / kHeadDim);
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int at = half * (kBlockN * 128) + r * 128;
            wgmma::TensorLoad2d(st.k(stage) + at, kv_map, half * 64, k_row, &st.full[stage]);
            wgmma::TensorLoad2d(st.v(stage) + at, kv_map, half * 64, v_row, &st.full[stage]);
          }
        }
      }
      if (whole < kBlockN) {
        LoadKvTile(p, table, w, n0, t, st.k(stage), st.v(stage), whole);
      }
    } else {
      LoadKvTile(p, table, w, n0, t, st.k(stage), st.v(stage));
    }
    wgmma::CpAsyncArriveOnBarrier(&st.full[stage]);
  }
  CpAsyncWaitAll();
}

// The FP8 staging buffers (Load::kFp8).
struct Fp8Staging {
  unsigned char* raw;  // [2][kFp8StagingBytes]: K rows, then V's 16-token groups.
  float* scales;       // [2][2][kBlockN]: K's, then V's.
  uint64_t* full;      // [2]: the buffer's bytes have landed.
  __device__ unsigned char* k(int b) const { return raw + b * kFp8StagingBytes; }
  __device__ unsigned char* v(int b) const { return k(b) + kBlockN * kHeadDim; }
  __device__ float* k_scales(int b) const { return scales + b * 2 * kBlockN; }
  __device__ float* v_scales(int b) const { return k_scales(b) + kBlockN; }
};

struct TokenScales {
  float k = 0.0f;
  float v = 0.0f;
};

// Starts tile `it` into staging buffer it % 2: the issuers (as in
// ProduceBf16) issue a box of block_size 128-byte rows per block of the tile
// with keys before kv_end, for K and for V (whose 16-token groups are
// 128-byte rows too); every
// thread loads its key's two scales (zero past kv_end), which it stores with
// StoreScales once they are needed.
__device__ __forceinline__ TokenScales StartFp8Tile(const PagedPrefillParams& p,
                                                    const CUtensorMap* map, const int32_t* table,
                                                    const CtaWork& w, int it,
                                                    const Fp8Staging& fs) {
  const int b = it % 2;
  const int n0 = it * kBlockN;
  const int bs = p.block_size;
  if (threadIdx.x % kIssuerStride == 0) {
    const int issuer = threadIdx.x / kIssuerStride;
    const int blocks = (min(kBlockN, w.kv_end - n0) + bs - 1) / bs;
    // The staging buffer's barrier counts this one arrival alone, so its
    // phase waits for it, and then for every issuer's bytes.
    if (issuer == 0) wgmma::BarrierArriveExpectBytes(&fs.full[b], blocks * bs * 128 * 2);
    const int64_t rows_per_block = p.block_stride_elems / 128;
    const int32_t value_rows = static_cast<int32_t>(p.value_offset_elems / 128);
    for (int i = issuer; i < blocks; i += kIssuers) {
      const int32_t k_row = static_cast<int32_t>(table[n0 / bs + i] * rows_per_block +
                                                 static_cast<int64_t>(w.kv_head) * bs);
      wgmma::TensorLoad2d(fs.k(b) + i * bs * 128, map, 0, k_row, &fs.full[b]);
      wgmma::TensorLoad2d(fs.v(b) + i * bs * 128, map, 0, k_row + value_rows, &fs.full[b]);
    }
  }
  TokenScales scales;
  const int pos = n0 + static_cast<int>(threadIdx.x);
  if (pos < w.kv_end) {
    const int block = table[pos / bs];
    const int slot = pos % bs;
    const float* at =
        reinterpret_cast<const float*>(static_cast<const unsigned char*>(p.kv_base) +
                                       block * p.block_stride_elems + p.scale_offset_elems);
    scales.k = at[w.kv_head * bs + slot];
    scales.v = at[(p.num_kv_heads + w.kv_head) * bs + slot];
  }
  return scales;
}

__device__ __forceinline__ void StoreScales(int it, const TokenScales& scales,
                                            const Fp8Staging& fs) {
  fs.k_scales(it % 2)[threadIdx.x] = scales.k;
  fs.v_scales(it % 2)[threadIdx.x] = scales.v;
}

// The producer warpgroup's barrier among itself (named barrier 1).
__device__ __forceinline__ void ProducerSync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kLoaders) : "memory");
}

// 16 stored E4M3 values of one group (index i at byte Fp8FragmentPosition(i):
// word l holds indices 2l, 2l + 1, 2l + 8, 2l + 9) times their scales, as
// bf16: indices 0-7 in `lo`, 8-15 in `hi`. scale(i) gives index i's scale.
template <typename ScaleOf>
__device__ __forceinline__ void DequantizeGroup(const uint4& raw, ScaleOf scale, uint4& lo,
                                                uint4& hi) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t out[8];
#pragma unroll
  for (int l = 0; l < 4; ++l) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(words[l] >> (16 * half)), __NV_E4M3);
      const float2 f = __half22float2(__half2(h));
      const int i = 2 * l + 8 * half;
      out[4 * half + l] = PackBf16(f.x * scale(i), f.y * scale(i + 1));
    }
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

// Dequantizes staging buffer it % 2 into the bf16 tiles: K rows into sk
// (K-major, as the bf16 path's), V's 16-token groups into sv transposed
// (rows of dims, keys along the swizzled rows). Keys at or past kv_end
// become zeros (the cache there may hold anything, NaN included).
__device__ __forceinline__ void DequantizeFp8Tile(const CtaWork& w, int it, const Fp8Staging& fs,
                                                  unsigned char* sk, unsigned char* sv) {
  const int b = it % 2;
  const int live = w.kv_end - it * kBlockN;  // Keys of the tile before kv_end (may pass 128).
  const int t = threadIdx.x;
  const float* const k_scales = fs.k_scales(b);
  const float* const v_scales = fs.v_scales(b);
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll 2
  for (int pass = 0; pass < kBlockN * kHeadDim / 16 / kLoaders; ++pass) {
    // Key r's 16-dim group c: consecutive threads read consecutive bytes.
    const int i = pass * kLoaders + t;
    const int r = i / (kHeadDim / 16);
    const int c = i % (kHeadDim / 16);
    uint4 lo = zero;
    uint4 hi = zero;
    if (r < live) {
      const float scale = k_scales[r];
      DequantizeGroup(
          *reinterpret_cast<const uint4*>(fs.k(b) + r * kHeadDim + c * 16),
          [scale](int) { return scale; }, lo, hi);
    }
    *reinterpret_cast<uint4*>(sk + SwizzledOffset<kBlockN>({r, 2 * c})) = lo;
    *reinterpret_cast<uint4*>(sk + SwizzledOffset<kBlockN>({r, 2 * c + 1})) = hi;
  }
#pragma unroll 2
  for (int g = 0; g < kBlockN / 16; ++g) {
    // Dim t's 16 keys of group g.
    const float* const scales = v_scales + 16 * g;
    uint4 lo = zero;
    uint4 hi = zero;
    if (16 * g < live) {
      const int valid = live - 16 * g;
      DequantizeGroup(
          *reinterpret_cast<const uint4*>(fs.v(b) + g * 2048 + t * 16),
          [scales, valid](int i) { return i < valid ? scales[i] : 0.0f; }, lo, hi);
      if (valid < 16) {
        // 0 x NaN is NaN: clear the keys past kv_end outright.
        uint32_t* const words[2] = {&lo.x, &hi.x};
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          if (i >= valid) words[i / 8][(i % 8) / 2] &= (i % 2 == 0) ? 0xffff0000u : 0x0000ffffu;
        }
      }
    }
    *reinterpret_cast<uint4*>(sv + SwizzledOffset<kHeadDim>({t, 2 * g})) = lo;
    *reinterpret_cast<uint4*>(sv + SwizzledOffset<kHeadDim>({t, 2 * g + 1})) = hi;
  }
}

// The producer warpgroup over the FP8 cache: Q by cp.async; tile it + 1's
// raw bytes on their way into one staging buffer while tile it's are
// dequantized from the other into stage it % 2 (once its tile before
// has been consumed).
__device__ __forceinline__ void ProduceFp8(const PagedPrefillParams& p, const CUtensorMap* map,
                                           const int32_t* table, const CtaWork& w, int num_n_tiles,
                                           const Stages& st, const Fp8Staging& fs) {
  constexpr int kStages = kPlainStages;
  LoadQ(p, w, threadIdx.x, st.smem);
  StoreScales(0, StartFp8Tile(p, map, table, w, 0, fs), fs);
  ProducerSync();
  for (int it = 0; it < num_n_tiles; ++it) {
    const int stage = it % kStages;
    const int use = it / kStages;
    TokenScales next;
    if (it + 1 < num_n_tiles) next = StartFp8Tile(p, map, table, w, it + 1, fs);
    wgmma::BarrierWait(&fs.full[it % 2], (it / 2) & 1);
    if (use > 0) wgmma::BarrierWait(&st.empty[stage], (use - 1) & 1);
    DequantizeFp8Tile(w, it, fs, st.k(stage), st.v(stage));
    if (it == 0) CpAsyncWaitAll();  // Q, which the consumers read from tile 0 on.
    // Plain stores here, wgmma's reads through the async proxy there.
    wgmma::FenceSharedForAsync();
    wgmma::BarrierArrive(&st.full[stage]);
    if (it + 1 < num_n_tiles) StoreScales(it + 1, next, fs);
    // Staging buffer it % 2 is free, and tile it + 1's scales are stored.
    ProducerSync();
  }
}

template <Load kLoad>
__device__ __forceinline__ void Produce(const PagedPrefillParams& p, const CUtensorMap* kv_map,
                                        const int32_t* table, const CtaWork& w, int num_n_tiles,
                                        const Stages& st, unsigned char* smem) {
  if constexpr (kLoad == Load::kFp8) {
    constexpr int kTilesBytes = TilesBytes(kPlainStages);
    const Fp8Staging fs{
        smem + kTilesBytes, reinterpret_cast<float*>(smem + kTilesBytes + 2 * kFp8StagingBytes),
        reinterpret_cast<uint64_t*>(smem + kFp8BarrierOffset + BarrierBytes(kPlainStages))};
    ProduceFp8(p, kv_map, table, w, num_n_tiles, st, fs);
  } else {
    ProduceBf16<kLoad == Load::kTma>(p, kv_map, table, w, num_n_tiles, st);
  }
}

// A consumer warpgroup (c = 0 or 1: query rows 64 c .. 64 c + 63 of the
// tile) taking turns with the other. Turn t issues P V of tile t - 1 and S of
// tile t back to back (tile t waited for before the turn is taken), passes,
// waits for both, releases tile t - 1 and takes tile t's softmax; turn
// num_n_tiles issues the last P V. Tiles past the rows' keys issue nothing
// but still take and pass their turns, so both consumers take as many. On
// the H200 at 16k tokens this ran 5% faster than the consumers on their own
// (Consume), given a third stage, and 17% slower with two.
template <bool kVKMajor>
__device__ __forceinline__ void ConsumeInTurns(const PagedPrefillParams& p, const CtaWork& w,
                                               int num_n_tiles, const Stages& st, int c) {
  constexpr int kStages = kTmaStages;
  const int warp_in_wg = (threadIdx.x % 128) / 32;
  const int g = (threadIdx.x % 32) / 4;
  const int row0 = c * 64 + warp_in_wg * 16 + g;
  const int wg_first_pos = w.first_row_pos + c * 64;
  const float scale_log2 = p.scale * 1.4426950408889634f;
  // Tiles [0, nc) have keys visible to the warpgroup's rows.
  // Warp-uniform in ptxas's eyes (a shuffle from lane 0), or it serializes
  // every wgmma behind the branches on it (C7520).
  const int nc = __shfl_sync(
      0xffffffffu, c * 64 < w.rows ? min(num_n_tiles, (wg_first_pos + 63) / kBlockN + 1) : 0, 0);
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  Softmax sm{{-INFINITY, -INFINITY}, {0.0f, 0.0f}};
  float s[kBlockN / 2];
  PFragment pa;
  if (c == 0) asm volatile("bar.arrive %0, 256;" ::"n"(kTurnBarrier) : "memory");  // See `pass`.
  QFragment qa;
  LoadQRegisters(p, w, row0, qa);
  const auto wait_full = [&](int t) {
    if (t < num_n_tiles) {
      wgmma::BarrierWait(&st.full[t % kStages], (t / kStages) & 1);
      wgmma::FenceSharedForAsync();
    }
  };
  const auto softmax = [&](int t) {
    const int n0 = t * kBlockN;
    OnlineSoftmax(s, o, sm, n0 + kBlockN - 1 > wg_first_pos, n0, w.first_row_pos + row0,
                  scale_log2);
    PackP(s, pa);
  };
  // Consumer 0 passes after its last turn, which consumer 1's last turn
  // waits for; consumer 1 does not (consumer 0 waits no more), so no arrival
  // is left pending on a barrier. Consumer 0 arrives on its own turn once
  // first: it goes first.
  const auto pass = [&](int t) {
    if (c == 0 || t < num_n_tiles) PassTurn(c);
  };
  // Turn 0: S of tile 0.
  wait_full(0);
  TakeTurn(c);
  if (nc > 0) {
    wgmma::Fence();
    IssueScoresRegQ(qa, st.k(0), s);
    wgmma::CommitGroup();
    pass(0);
    wgmma::WaitGroup<0>();
    softmax(0);
  } else {
    pass(0);
  }
  // Turns 1 .. nc - 1: P V of tile t - 1, then S of tile t.
  for (int t = 1; t < nc; ++t) {
    wait_full(t);
    TakeTurn(c);
    wgmma::Fence();
    IssuePv<kVKMajor>(pa, st.v((t - 1) % kStages), o);
    IssueScoresRegQ(qa, st.k(t % kStages), s);
    wgmma::CommitGroup();
    pass(t);
    wgmma::WaitGroup<0>();
    wgmma::BarrierArrive(&st.empty[(t - 1) % kStages]);
    softmax(t);
  }
  // Turn nc: P V of the last visible tile; then turns with nothing to issue.
  for (int t = max(nc, 1); t <= num_n_tiles; ++t) {
    wait_full(t);
    TakeTurn(c);
    if (t == nc) {
      wgmma::Fence();
      IssuePv<kVKMajor>(pa, st.v((t - 1) % kStages), o);
      wgmma::CommitGroup();
      pass(t);
      wgmma::WaitGroup<0>();
    } else {
      pass(t);
    }
    wgmma::BarrierArrive(&st.empty[(t - 1) % kStages]);
  }
  if (c * 64 < w.rows) StoreOutput(p, w, o, sm, row0);
}

// A consumer warpgroup (c = 0 or 1: query rows 64 c .. 64 c + 63 of the
// tile) on its own: every tile is waited for and released, computed on when
// some of its keys are visible to the warpgroup's rows: S, the softmax, then
// P V, each product waited for.
template <bool kVKMajor>
__device__ __forceinline__ void Consume(const PagedPrefillParams& p, const CtaWork& w,
                                        int num_n_tiles, const Stages& st, int c) {
  constexpr int kStages = kPlainStages;
  const int warp_in_wg = (threadIdx.x % 128) / 32;
  const int g = (threadIdx.x % 32) / 4;
  const int row0 = c * 64 + warp_in_wg * 16 + g;  // The thread's first row in the tile.
  const int wg_first_pos = w.first_row_pos + c * 64;
  const bool wg_has_rows = c * 64 < w.rows;
  const float scale_log2 = p.scale * 1.4426950408889634f;
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  Softmax sm{{-INFINITY, -INFINITY}, {0.0f, 0.0f}};
  for (int it = 0; it < num_n_tiles; ++it) {
    const int stage = it % kStages;
    wgmma::BarrierWait(&st.full[stage], (it / kStages) & 1);
    // cp.async (or the FP8 producer's stores) wrote through the generic
    // proxy; wgmma reads through the async one.
    wgmma::FenceSharedForAsync();
    const int n0 = it * kBlockN;
    if (wg_has_rows && n0 <= wg_first_pos + 63) {
      float s[kBlockN / 2];
      PFragment pa;
      wgmma::Fence();
      IssueScores(st.smem + c * 64 * 128, st.k(stage), s);
      wgmma::CommitGroup();
      wgmma::WaitGroup<0>();
      OnlineSoftmax(s, o, sm, n0 + kBlockN - 1 > wg_first_pos, n0, w.first_row_pos + row0,
                    scale_log2);
      PackP(s, pa);
      wgmma::Fence();
      IssuePv<kVKMajor>(pa, st.v(stage), o);
      wgmma::CommitGroup();
      wgmma::WaitGroup<0>();
    }
    wgmma::BarrierArrive(&st.empty[stage]);
  }
  if (wg_has_rows) StoreOutput(p, w, o, sm, row0);
}

// kTableInSmem: the sequence's block table is copied into shared memory first,
// so the producer's gathers wait on shared memory instead of a global load.
template <Load kLoad, bool kTableInSmem>
__global__ void __launch_bounds__(kThreads, 1)
    PagedPrefillSm90Kernel(const PagedPrefillParams p, const __grid_constant__ CUtensorMap kv_map) {
  extern __shared__ __align__(1024) unsigned char smem[];
  // Heads fastest (the heads of a kv head share its tiles in L2), query tiles
  // heaviest first (the causal triangle's long tail starts early).
  CtaWork w;
  w.seq = blockIdx.z;
  w.head = blockIdx.x;
  w.m0 = (gridDim.y - 1 - blockIdx.y) * kBlockM;
  const int query_len = p.query_lens[w.seq];
  const int context_len = p.context_lens[w.seq];
  if (w.m0 >= query_len || query_len > context_len ||
      context_len > p.max_blocks_per_seq * p.block_size) {
    return;
  }
  w.kv_head = w.head / (p.num_q_heads / p.num_kv_heads);
  w.rows = min(kBlockM, query_len - w.m0);
  w.query_start = p.query_starts[w.seq];
  w.first_row_pos = context_len - query_len + w.m0;
  w.kv_end = w.first_row_pos + w.rows;
  const int num_n_tiles = (w.kv_end + kBlockN - 1) / kBlockN;

  constexpr bool kFp8 = kLoad == Load::kFp8;
  constexpr int kStages = StagesOf(kLoad);
  uint64_t* const barriers =
      reinterpret_cast<uint64_t*>(smem + (kFp8 ? kFp8BarrierOffset : TilesBytes(kStages)));
  const Stages st{smem, barriers, barriers + kStages};
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      // Every producer thread's arrival (cp.async's, or the FP8 producer's
      // after its stores), and with the tensor copy engine into the stage
      // the first thread's expected bytes.
      wgmma::BarrierInit(&st.full[i], kLoaders + (kLoad == Load::kTma ? 1 : 0));
      wgmma::BarrierInit(&st.empty[i], kThreads - kLoaders);
    }
    if constexpr (kFp8) {
      // The staging buffers: the first thread's expected bytes alone.
      for (int i = 0; i < 2; ++i) wgmma::BarrierInit(barriers + 2 * kStages + i, 1);
    }
  }
  const int32_t* table = p.block_tables + static_cast<int64_t>(w.seq) * p.max_blocks_per_seq;
  if constexpr (kTableInSmem) {
    int32_t* const copy = reinterpret_cast<int32_t*>(smem + SmemBytes(kLoad));
    const int blocks = (w.kv_end + p.block_size - 1) / p.block_size;
    for (int i = threadIdx.x; i < blocks; i += kThreads) copy[i] = table[i];
    table = copy;
  }
  __syncthreads();
  if (threadIdx.x < kLoaders) {
    wgmma::DecreaseRegisters<ProducerRegisters(kLoad)>();
    Produce<kLoad>(p, &kv_map, table, w, num_n_tiles, st, smem);
  } else {
    wgmma::IncreaseRegisters<ConsumerRegisters(kLoad)>();
    const int c = threadIdx.x / 128 - 1;
    if constexpr (kLoad == Load::kTma) {
      ConsumeInTurns<false>(p, w, num_n_tiles, st, c);
    } else {
      Consume<kFp8>(p, w, num_n_tiles, st, c);
    }
  }
}

template <Load kLoad, bool kTableInSmem>
cudaError_t LaunchSm90(const PagedPrefillParams& params, const CUtensorMap& kv_map, int smem_bytes,
                       cudaStream_t stream) {
  auto* kernel = &PagedPrefillSm90Kernel<kLoad, kTableInSmem>;
  const cudaError_t error =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (error != cudaSuccess) return error;
  const dim3 grid(params.num_q_heads, (params.max_query_len + kBlockM - 1) / kBlockM, params.batch);
  kernel<<<grid, kThreads, smem_bytes, stream>>>(params, kv_map);
  return cudaGetLastError();
}

// The block table in shared memory when it fits (beside three stages, up to
// 752 blocks: 12032 tokens in blocks of 16).
template <Load kLoad>
cudaError_t LaunchPlacingTable(const PagedPrefillParams& params, const CUtensorMap& kv_map,
                               cudaStream_t stream) {
  const int table_bytes = (params.max_blocks_per_seq * 4 + 15) / 16 * 16;
  if (table_bytes > TableBytesLimit(kLoad)) {
    return LaunchSm90<kLoad, false>(params, kv_map, SmemBytes(kLoad), stream);
  }
  return LaunchSm90<kLoad, true>(params, kv_map, SmemBytes(kLoad) + table_bytes, stream);
}

// The cache as a 2-D tensor of `rows` rows of `row_elems` elements, boxes of
// box_elems x block_size rows. Rows are addressed by 32-bit coordinates; the
// map spans 256 GiB, past any cache, and only rows of named blocks are read.
bool EncodeRows(const PagedPrefillParams& params, CUtensorMapDataType type, int elem_bytes,
                int box_elems, CUtensorMapSwizzle swizzle, CUtensorMap* map) {
  const uint64_t row_bytes = static_cast<uint64_t>(kHeadDim) * elem_bytes;
  return wgmma::EncodeRowMap(map, params.kv_base, type, kHeadDim, (uint64_t{1} << 38) / row_bytes,
                             row_bytes, static_cast<uint32_t>(box_elems),
                             static_cast<uint32_t>(params.block_size), swizzle);
}

// The bf16 cache as rows of 256 bytes (one token's 128 dims of one kv head),
// boxes of block_size rows x 64 dims landing 128-byte-swizzled: the tile
// layout above. False where the tensor copy engine cannot take the cache
// (blocks not whole 128-element rows apart, a block size that does not tile
// the KV tiles, or no encoder in the driver).
bool EncodeKvMap(const PagedPrefillParams& params, CUtensorMap* map) {
  const int bs = params.block_size;
  if (bs % 8 != 0 || kBlockN % bs != 0 || params.block_stride_elems % kHeadDim != 0 ||
      params.value_offset_elems % kHeadDim != 0) {
    return false;
  }
  return EncodeRows(params, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, 64, CU_TENSOR_MAP_SWIZZLE_128B,
                    map);
}

// Whether the FP8 cache's blocks lie whole 128-byte rows apart, K's and V's
// alike, in blocks that tile the KV tiles: what Load::kFp8 stages.
bool Fp8RowsApply(const PagedPrefillParams& params) {
  return params.block_size % 16 == 0 && kBlockN % params.block_size == 0 &&
         params.block_stride_elems % 128 == 0 && params.value_offset_elems % 128 == 0;
}

// The FP8 cache as rows of 128 bytes (a token's K for one kv head, or 8 dims
// of a V group), boxes of block_size whole rows, unswizzled.
bool EncodeFp8Map(const PagedPrefillParams& params, CUtensorMap* map) {
  return Fp8RowsApply(params) && EncodeRows(params, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, kHeadDim,
                                            CU_TENSOR_MAP_SWIZZLE_NONE, map);
}

}  // namespace

bool PagedPrefillSm90Supports(const PagedPrefillParams& params) {
  return params.head_dim == kHeadDim && (!params.kv_fp8 || Fp8RowsApply(params));
}

cudaError_t PagedPrefillAttentionSm90(const PagedPrefillParams& params, cudaStream_t stream) {
  CUtensorMap map{};
  if (params.kv_fp8) {
    // Without the tensor copy engine, the mma.sync kernel reads the FP8 cache.
    if (!EncodeFp8Map(params, &map)) return PagedPrefillAttention(params, stream);
    return LaunchSm90<Load::kFp8, false>(params, map, kFp8SmemBytes, stream);
  }
  if (EncodeKvMap(params, &map)) return LaunchPlacingTable<Load::kTma>(params, map, stream);
  return LaunchPlacingTable<Load::kCpAsync>(params, map, stream);
}

}  // namespace trident::kernels::cuda::internal
