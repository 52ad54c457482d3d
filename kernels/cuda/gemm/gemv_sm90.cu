// Hopper's single-row GEMV: W streamed through shared memory by the bulk
// copy engine, in a pipeline deep enough to keep the read ceiling busy, whose
// first stages are issued before the kernel waits for the one ahead.

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kernels/cuda/arch/shared_memory.h"
#include "kernels/cuda/gemm/gemv_device.h"
#include "kernels/cuda/gemm/gemv_sm90_kernel.h"
#include "kernels/cuda/pdl/pdl_device.h"
#include "kernels/cuda/rms_norm/rms_norm_device.h"
#include "kernels/cuda/rope/rope_device.h"
#include "kernels/cuda/wgmma/wgmma_device.h"

namespace trident::kernels::cuda::internal {
namespace {

// y[n] (+)= x[k] · Wᵀ for one row x. The work is W's rows in items of
// kItemRows; each CTA (kCtasPerSm per SM at most) takes a contiguous run of
// items, so the CTAs' shares differ by one item at most and each CTA reads
// one contiguous range of W.
//
// One producer thread walks the CTA's items chunk by chunk (kChunk
// elements of each of the item's rows: a stage) and copies each stage into
// a ring of kStages shared buffers with the bulk copy engine. A consumer
// warp per row of the item takes the stages in turn: each lane dots
// eight of the row's 16-byte pieces with x (read through L1) and, after the
// item's last chunk, the warp's lanes are summed and lane 0 writes y[row].
//
// Programmatic dependent launch: W does not depend on the kernel ahead (a
// norm, attention, the activation), so the producer starts at once and the
// ring fills while that kernel ends; the consumers wait for it (x, and y
// when accumulating, are its results).
//
// Eight rows of 4 KiB a stage, three stages, two CTAs per SM: 16 consumer
// warps and 192 KiB of W in flight per SM. On an H200 (8B shape) this beat
// 4 rows x 6 stages, 4 x 3 with four CTAs, 4 x 6 or 13 with one CTA, 16
// rows of 2 KiB, 12 x 2 stages and 1 or 4 KiB chunks, and the evict-first
// hint beat none (bench/RESULTS.md).
constexpr int kItemRows = 8;
constexpr int kChunk = 2048;
constexpr int kStages = 3;
constexpr int kCtasPerSm = 2;
constexpr int kConsumerWarps = kItemRows;
constexpr int kThreads = (kConsumerWarps + 1) * 32;
constexpr uint32_t kRowBytes = kChunk * 2;
constexpr uint32_t kStageBytes = kItemRows * kRowBytes;
constexpr size_t kBarrierBytes = 2 * kStages * sizeof(uint64_t);
// Past the ring: the barriers, the epilogues' exchange (kItemRows floats),
// then (dynamic items) the item each ring slot holds.
constexpr size_t kStageItemsOffset =
    kStages * kStageBytes + kBarrierBytes + kItemRows * sizeof(float);
constexpr size_t kSharedBytes = kStageItemsOffset + kStages * sizeof(int32_t);
// With a fused norm: the warps' partial sums of squares (at most 16: the
// norm kernel's 512 threads), then the normed bf16 row.
constexpr size_t kNormSumsOffset = kSharedBytes;
constexpr size_t kNormRowOffset = (kNormSumsOffset + 16 * sizeof(float) + 15) / 16 * 16;
// An SM's 228 KiB, less 1 KiB per CTA the runtime keeps.
constexpr int64_t kNormMaxK =
    ((int64_t{228} * 1024 / kCtasPerSm - 1024 - static_cast<int64_t>(kNormRowOffset)) / 2) / 8 * 8;

// What the consumers write: y[row] in bf16 or f32, or (kSiluMulBf16) W's
// rows n.. are the up projection of rows 0..n-1 (the gate), and y[j] =
// silu(gate_j) * up_j in bf16 (an item then holds kItemRows / 2 gate rows
// and then their up rows), or (kRopeBf16) y is q, k and v of one token in
// bf16 with q and k rotated (GemvRope: an item of the rotated heads holds
// kItemRows / 2 dims i of one head and then their partners i + half).
enum class Out { kBf16, kF32, kSiluMulBf16, kRopeBf16 };

struct Walk {
  int64_t n, k;
  int64_t chunks;      // per item: ceil(k / kChunk)
  int64_t first_item;  // this CTA's first item
  int64_t stages;      // this CTA's items times chunks
  int64_t items;       // the grid's
  // Dynamic items (GemvSchedule): the grid claims items one at a time from
  // counter[0]; the producer puts each slot's item in stage_items (-1: no
  // more). Null: each CTA takes its contiguous run.
  uint32_t* counter = nullptr;
  int32_t* stage_items = nullptr;
  GemvRope rope;  // kRopeBf16's heads
  // kRopeBf16: where the token's slot starts in the KV cache (-1: nothing
  // stored), set before the wait on the kernel ahead (KvSlotBase).
  int64_t kv_slot_base = -1;
};

// Items of kRopeBf16's rotated heads.
__device__ __forceinline__ int64_t RopeItems(const GemvRope& rope) {
  return int64_t{rope.rope_heads} * rope.head_dim / kItemRows;
}

// W's row behind row r of item `item`, or -1 past the end.
template <Out kOut>
__device__ __forceinline__ int64_t SourceRow(int64_t item, int r, const Walk& walk) {
  constexpr int kHalf = kItemRows / 2;
  if constexpr (kOut == Out::kSiluMulBf16) {
    const int64_t j = kHalf * item + r % kHalf;
    return j < walk.n ? j + (r >= kHalf ? walk.n : 0) : -1;
  } else {
    const int64_t rope_items = kOut == Out::kRopeBf16 ? RopeItems(walk.rope) : 0;
    if (item < rope_items) {
      // Pair p: dim p % half of rotated head p / half (32-bit: n < 2^31).
      const uint32_t half = static_cast<uint32_t>(walk.rope.head_dim) / 2;
      const uint32_t p = static_cast<uint32_t>(item) * kHalf + r % kHalf;
      return int64_t{p / half} * walk.rope.head_dim + p % half + (r >= kHalf ? half : 0);
    }
    const int64_t row = item * kItemRows + r;
    return row < walk.n ? row : -1;
  }
}

// Items of n outputs.
template <Out kOut>
__host__ __device__ __forceinline__ int64_t Items(int64_t n) {
  constexpr int kPerItem = kOut == Out::kSiluMulBf16 ? kItemRows / 2 : kItemRows;
  return (n + kPerItem - 1) / kPerItem;
}

template <Out kOut>
__device__ __forceinline__ Walk MakeWalk(int64_t n, int64_t k, const GemvRope& rope) {
  Walk w;
  w.n = n;
  w.k = k;
  w.rope = rope;
  w.chunks = (k + kChunk - 1) / kChunk;
  const int64_t items = Items<kOut>(n);
  w.items = items;
  w.first_item = items * blockIdx.x / gridDim.x;
  w.stages = (items * (blockIdx.x + 1) / gridDim.x - w.first_item) * w.chunks;
  return w;
}

// The next item of the CTA's (-1: none): `next` of its run, or claimed
// from the grid's counter.
__device__ __forceinline__ int64_t TakeItem(const Walk& walk, int64_t& next, int64_t end) {
  if (walk.counter == nullptr) return next < end ? next++ : -1;
  const int64_t item = atomicAdd(walk.counter, 1u);
  return item < walk.items ? item : -1;
}

// Dynamic items, after the producer's last claim: a slot whose item is -1
// ends the consumers' walk, and the grid's last CTA to get there zeroes the
// counters for the next launch that takes them.
__device__ __forceinline__ void EndDynamicWalk(const Walk& walk, uint64_t* full, uint64_t* empty,
                                               int slot, uint32_t phase, int64_t s) {
  if (s >= kStages) wgmma::BarrierWait(&empty[slot], phase ^ 1);
  walk.stage_items[slot] = -1;
  wgmma::BarrierArrive(&full[slot]);
  if (atomicAdd(walk.counter + 1, 1u) == gridDim.x - 1) {
    atomicExch(walk.counter, 0u);
    atomicExch(walk.counter + 1, 0u);
  }
}

template <Out kOut>
__device__ void Produce(const __nv_bfloat16* __restrict__ w, const Walk& walk, unsigned char* ring,
                        uint64_t* full, uint64_t* empty) {
  const uint64_t policy = wgmma::EvictFirstPolicy();
  int slot = 0;
  uint32_t phase = 0;
  int64_t s = 0;
  int64_t next = walk.first_item;
  const int64_t end = walk.first_item + walk.stages / walk.chunks;
  // The next claim is made before the current item's copies, so its
  // latency hides behind them.
  for (int64_t item = TakeItem(walk, next, end); item >= 0;) {
    const int64_t following = TakeItem(walk, next, end);
    int64_t rows[kItemRows];
#pragma unroll
    for (int r = 0; r < kItemRows; ++r) rows[r] = SourceRow<kOut>(item, r, walk);
    for (int64_t col = 0; col < walk.k; col += kChunk, ++s) {
      // The slot's previous stage (one lap back, the other phase) consumed.
      if (s >= kStages) wgmma::BarrierWait(&empty[slot], phase ^ 1);
      if (walk.counter != nullptr) walk.stage_items[slot] = static_cast<int32_t>(item);
      const uint32_t bytes = static_cast<uint32_t>(min(int64_t{kChunk}, walk.k - col)) * 2;
      uint32_t total = 0;
#pragma unroll
      for (int r = 0; r < kItemRows; ++r) total += rows[r] >= 0 ? bytes : 0;
      wgmma::BarrierArriveExpectBytes(&full[slot], total);
      unsigned char* const stage = ring + slot * kStageBytes;
#pragma unroll
      for (int r = 0; r < kItemRows; ++r) {
        if (rows[r] < 0) continue;
        wgmma::BulkLoad(stage + r * kRowBytes, w + rows[r] * walk.k + col, bytes, &full[slot],
                        policy);
      }
      if (++slot == kStages) {
        slot = 0;
        phase ^= 1;
      }
    }
    item = following;
  }
  if (walk.counter != nullptr) EndDynamicWalk(walk, full, empty, slot, phase, s);
}

// The dot product of one row's chunk (its 16-byte pieces in shared memory)
// with x's matching pieces, accumulated into acc.
// x's 16-byte piece: through L1 from global memory, or (kSharedX, the
// fused norm's row) from shared memory.
template <bool kSharedX>
__device__ __forceinline__ uint4 XPiece(const uint4* xs, int p) {
  if constexpr (kSharedX) {
    return xs[p];
  } else {
    return __ldg(xs + p);
  }
}

template <bool kSharedX>
__device__ __forceinline__ float DotChunk(const uint4* ws, const uint4* xs, int pieces, int lane,
                                          float acc) {
  if (pieces == kChunk / 8) {
    constexpr int kPiecesPerLane = kChunk / 8 / 32;
    uint4 wv[kPiecesPerLane], xv[kPiecesPerLane];
#pragma unroll
    for (int i = 0; i < kPiecesPerLane; ++i) {
      wv[i] = ws[lane + 32 * i];
      xv[i] = XPiece<kSharedX>(xs, lane + 32 * i);
    }
    float part[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < kPiecesPerLane; ++i) part[i & 1] = Dot8(wv[i], xv[i], part[i & 1]);
    return acc + (part[0] + part[1]);
  }
  for (int p = lane; p < pieces; p += 32) acc = Dot8(ws[p], XPiece<kSharedX>(xs, p), acc);
  return acc;
}

// The fused norm's per-thread vectors: a consumer thread plays threads tid
// and tid + 256 of the norm kernel's block (rms_norm::BlockThreads(k / 4)
// threads; thread t takes 4-element vectors t, t + threads, ...), at most
// kNormVecs vectors each.
constexpr int kNormVecs = static_cast<int>((kNormMaxK / 4 + 511) / 512);

struct NormVectors {
  float4 v[2][kNormVecs];
};

// Vector m of the consumer thread's virtual thread h, or zeros past the row.
__device__ __forceinline__ bool NormVectorAt(int64_t k, int h, int m, int64_t& i) {
  const int threads = rms_norm::BlockThreads(k / 4);
  const int t = static_cast<int>(threadIdx.x) + h * kConsumerWarps * 32;
  i = t + int64_t{m} * threads;
  return t < threads && i < k / 4;
}

__device__ __forceinline__ void LoadNormVectors(const float* __restrict__ p, int64_t k,
                                                NormVectors& out) {
  const float4* p4 = reinterpret_cast<const float4*>(p);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int m = 0; m < kNormVecs; ++m) {
      int64_t i;
      out.v[h][m] = NormVectorAt(k, h, m, i) ? p4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
}

// The consumer warps write bf16(weight * (x * r)) of the f32 row x [k] to
// `row` in shared memory with the norm kernel's bits: each of their warps'
// butterflies is one of the kernel's, and `sums` holds the kernel's
// per-warp sums in its order. `weight` holds the norm's weights, loaded
// (before the kernel ahead ended) by LoadNormVectors.
__device__ void NormRow(const float* __restrict__ x, const NormVectors& weight, float eps,
                        int64_t k, __nv_bfloat16* row, float* sums) {
  constexpr int kConsumers = kConsumerWarps * 32;
  NormVectors xv;
  LoadNormVectors(x, k, xv);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = 0.0f;
#pragma unroll
    for (int m = 0; m < kNormVecs; ++m) {
      const float4 v = xv.v[h][m];
      sum = fmaf(v.x, v.x, sum);
      sum = fmaf(v.y, v.y, sum);
      sum = fmaf(v.z, v.z, sum);
      sum = fmaf(v.w, v.w, sum);
    }
    sum = rms_norm::WarpButterflySum(sum);
    int64_t i;
    const int t = static_cast<int>(threadIdx.x) + h * kConsumers;
    if (NormVectorAt(k, h, 0, i) && t % 32 == 0) sums[t / 32] = sum;
  }
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");
  const int threads = rms_norm::BlockThreads(k / 4);
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const float total = rms_norm::WarpButterflySum(lane < threads / 32 ? sums[lane] : 0.0f);
  const float r = rms_norm::InverseRms(total, k, eps);
  auto* row2 = reinterpret_cast<__nv_bfloat162*>(row);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int m = 0; m < kNormVecs; ++m) {
      int64_t i;
      if (!NormVectorAt(k, h, m, i)) continue;
      const float4 v = xv.v[h][m];
      const float4 g = weight.v[h][m];
      row2[2 * i] =
          __floats2bfloat162_rn(rms_norm::Scaled(v.x, g.x, r), rms_norm::Scaled(v.y, g.y, r));
      row2[2 * i + 1] =
          __floats2bfloat162_rn(rms_norm::Scaled(v.z, g.z, r), rms_norm::Scaled(v.w, g.w, r));
    }
  }
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");
}

// kRopeBf16's item results: the sum (+ the f32 bias) of each row, as the
// f32 GEMV would store it; in a rotated head the partner warps hand theirs
// over (as the SiLU's up warps do) and warp w < kItemRows / 2 rotates its
// pair with the RoPE kernel's arithmetic; v rows are rounded as they are.
// Element `row` of y (q, k, v) into the KV cache where it is k or v and
// GemvRope::kv has a cache, as kernels/cuda/kv_append stores it.
__device__ __forceinline__ void StoreKv(const Walk& walk, int64_t row, __nv_bfloat16 value) {
  const GemvRope& rope = walk.rope;
  const int64_t first_k = int64_t{rope.q_heads} * rope.head_dim;
  if (walk.kv_slot_base < 0 || row < first_k) return;
  const int64_t first_v = int64_t{rope.rope_heads} * rope.head_dim;
  const bool is_v = row >= first_v;
  // 32-bit: n < 2^31.
  const uint32_t e = static_cast<uint32_t>(row - (is_v ? first_v : first_k));
  const uint32_t head_dim = static_cast<uint32_t>(rope.head_dim);
  const uint32_t head = e / head_dim;
  // The slot's place (KvSlotBase kept only its base, to hold one register).
  const KvSlot place{walk.kv_slot_base, rope.kv.value_offset,
                     int64_t{rope.kv.block_size} * rope.head_dim};
  static_cast<__nv_bfloat16*>(rope.kv.base)[place.At(is_v, head, e - head * head_dim)] = value;
}

// The pair of consumer warps w and w + kItemRows / 2 (a gate and its up
// row, a dim and its partner) meet at named barrier 2 + w % (kItemRows / 2).
__device__ __forceinline__ void PairBarrier(int warp) {
  asm volatile("bar.sync %0, 64;" ::"r"(2 + warp % (kItemRows / 2)) : "memory");
}

// The start of the token's slot in the KV cache, or -1 (no cache, or a
// slot outside it). slots is a step input, not the kernel ahead's result,
// so this runs before the wait.
__device__ __forceinline__ int64_t KvSlotBase(const GemvRope& rope) {
  return rope.kv.Of(0, rope.head_dim).base;
}

__device__ __forceinline__ void FinishRope(float sum, int64_t source_row, int64_t item, int parity,
                                           int warp, int lane, const float* bias, __nv_bfloat16* y,
                                           float* exchange, const Walk& walk) {
  const GemvRope& rope = walk.rope;
  if (source_row >= 0 && bias != nullptr) sum += bias[source_row];
  if (item >= RopeItems(rope)) {
    if (lane == 0 && source_row >= 0) {
      const __nv_bfloat16 v = __float2bfloat16_rn(sum);
      y[source_row] = v;
      StoreKv(walk, source_row, v);
    }
    return;
  }
  constexpr int kHalf = kItemRows / 2;
  float* const partners = exchange + kHalf * parity;
  if (warp >= kHalf && lane == 0) partners[warp - kHalf] = sum;
  PairBarrier(warp);
  if (warp < kHalf && lane == 0) {
    const int half = rope.head_dim / 2;
    float c, s, a, b;
    rope::CosSin(static_cast<float>(rope.positions[0]),
                 rope.inv_freq[static_cast<int>(source_row % rope.head_dim)], c, s);
    rope::Rotate(sum, partners[warp], c, s, a, b);
    const __nv_bfloat16 lo = __float2bfloat16_rn(a), hi = __float2bfloat16_rn(b);
    y[source_row] = lo;
    y[source_row + half] = hi;
    StoreKv(walk, source_row, lo);
    StoreKv(walk, source_row + half, hi);
  }
}

// The plain outputs' RowInputs (the bias, and y's old value when
// accumulating) are loaded by lane 0 as an item starts and used as it ends
// (Finish): loaded at the end, each item's last step waited an L2 round
// trip for them.
template <Out kOut>
__device__ __forceinline__ RowInputs StartItem(const void* bias, const void* y, int64_t row,
                                               bool accumulate, int lane) {
  if constexpr (kOut == Out::kBf16 || kOut == Out::kF32) {
    if (lane == 0 && row >= 0) return LoadRowInputs<kOut == Out::kF32>(bias, y, row, accumulate);
  }
  return RowInputs{};
}

// Writes an item's results, once each consumer warp holds its row's sum
// (in every lane); `in` is StartItem's. `exchange` is kItemRows floats of
// shared memory.
template <Out kOut>
__device__ __forceinline__ void Finish(float sum, int64_t source_row, int64_t item, int parity,
                                       int warp, int lane, const void* bias, void* y,
                                       bool accumulate, const RowInputs& in, float* exchange,
                                       const Walk& walk) {
  if constexpr (kOut == Out::kRopeBf16) {
    FinishRope(sum, source_row, item, parity, warp, lane, static_cast<const float*>(bias),
               static_cast<__nv_bfloat16*>(y), exchange, walk);
  } else if constexpr (kOut == Out::kSiluMulBf16) {
    if (source_row >= 0 && bias != nullptr) sum += static_cast<const float*>(bias)[source_row];
    // The up warps hand their sums to the gate warps (a buffer per parity
    // of the CTA's items: a warp writes one again only after the other
    // parity's barrier, which the readers pass after reading).
    constexpr int kHalf = kItemRows / 2;
    float* const ups = exchange + kHalf * parity;
    if (warp >= kHalf && lane == 0) ups[warp - kHalf] = sum;
    PairBarrier(warp);
    if (warp < kHalf && lane == 0 && source_row >= 0) {
      const float up = ups[warp];
      static_cast<__nv_bfloat16*>(y)[source_row] =
          __float2bfloat16_rn(sum / (1.0f + __expf(-sum)) * up);
    }
  } else {
    if (lane == 0 && source_row >= 0) {
      StoreRow<kOut == Out::kF32>(sum, in, bias != nullptr, y, source_row, accumulate);
    }
  }
}

template <Out kOut, bool kSharedX>
__device__ void Consume(const __nv_bfloat16* __restrict__ x, const void* __restrict__ bias,
                        void* __restrict__ y, bool accumulate, const Walk& walk,
                        const unsigned char* ring, uint64_t* full, uint64_t* empty,
                        float* exchange) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const uint4* xs = reinterpret_cast<const uint4*>(x);
  const bool dynamic = walk.counter != nullptr;
  float acc = 0.0f;
  int slot = 0;
  uint32_t phase = 0;
  int64_t col = 0;   // the chunk's first column
  int64_t done = 0;  // items finished (their parity picks the exchange buffer)
  int64_t item = walk.first_item;
  RowInputs in;
  for (int64_t s = 0; dynamic || s < walk.stages; ++s) {
    wgmma::BarrierWait(&full[slot], phase);
    if (dynamic) {
      item = walk.stage_items[slot];
      if (item < 0) break;
    }
    const int64_t row = SourceRow<kOut>(item, warp, walk);
    if (col == 0) in = StartItem<kOut>(bias, y, row, accumulate, lane);
    if (row >= 0) {
      const int pieces = static_cast<int>(min(int64_t{kChunk}, walk.k - col) / 8);
      const unsigned char* const mine = ring + slot * kStageBytes + warp * kRowBytes;
      acc =
          DotChunk<kSharedX>(reinterpret_cast<const uint4*>(mine), xs + col / 8, pieces, lane, acc);
    }
    __syncwarp();
    if (lane == 0) wgmma::BarrierArrive(&empty[slot]);
    if (++slot == kStages) {
      slot = 0;
      phase ^= 1;
    }
    col += kChunk;
    if (col >= walk.k) {
      Finish<kOut>(WarpSum(acc), row, item, static_cast<int>(done & 1), warp, lane, bias, y,
                   accumulate, in, exchange, walk);
      acc = 0.0f;
      col = 0;
      ++done;
      ++item;
    }
  }
}

// kNorm: x is the f32 row the fused norm takes (GemvNorm).
template <Out kOut, bool kNorm>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    GemvBulkKernel(const void* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                   const void* __restrict__ bias, void* __restrict__ y, int64_t n, int64_t k,
                   bool accumulate, GemvNorm norm, GemvRope rope, GemvSchedule schedule) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* const empty = full + kStages;
  float* const exchange = reinterpret_cast<float*>(smem + kStages * kStageBytes + kBarrierBytes);
  Walk walk = MakeWalk<kOut>(n, k, rope);
  walk.counter = schedule.counter;
  walk.stage_items = reinterpret_cast<int32_t*>(smem + kStageItemsOffset);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      wgmma::BarrierInit(&full[i], 1);                // the producer's expected bytes
      wgmma::BarrierInit(&empty[i], kConsumerWarps);  // each consumer warp's lane 0
    }
  }
  __syncthreads();
  pdl::LetDependentsLaunch();
  if (threadIdx.x / 32 == kConsumerWarps) {
    if (threadIdx.x % 32 == 0) Produce<kOut>(w, walk, smem, full, empty);
    return;
  }
  if constexpr (kOut == Out::kRopeBf16) walk.kv_slot_base = KvSlotBase(rope);
  if constexpr (kNorm) {
    // The norm's weights do not depend on the kernel ahead; x does.
    NormVectors weight;
    LoadNormVectors(norm.weight, k, weight);
    pdl::WaitForPreviousGrid();
    auto* row = reinterpret_cast<__nv_bfloat16*>(smem + kNormRowOffset);
    NormRow(static_cast<const float*>(x), weight, norm.eps, k, row,
            reinterpret_cast<float*>(smem + kNormSumsOffset));
    Consume<kOut, true>(row, bias, y, accumulate, walk, smem, full, empty, exchange);
  } else {
    pdl::WaitForPreviousGrid();
    Consume<kOut, false>(static_cast<const __nv_bfloat16*>(x), bias, y, accumulate, walk, smem,
                         full, empty, exchange);
  }
}

template <Out kOut, bool kNorm>
cudaError_t Launch(const void* x, const void* w, const void* bias, void* y, int64_t n, int64_t k,
                   bool accumulate, int sms, bool pdl, cudaStream_t stream, const GemvNorm& norm,
                   const GemvRope& rope, const GemvSchedule& schedule) {
  if (sms <= 0 || (kNorm && (k % 8 != 0 || k > kNormMaxK))) return cudaErrorInvalidValue;
  auto* kernel = &GemvBulkKernel<kOut, kNorm>;
  // The norm's row is sized for the longest k, so the attribute is set once.
  constexpr size_t kBytes = kNorm ? kNormRowOffset + 2 * kNormMaxK : kSharedBytes;
  static std::atomic<uint64_t> configured{0};
  const cudaError_t error = ConfigureSharedMemoryOnce(kernel, kBytes, configured);
  if (error != cudaSuccess) return error;
  const size_t bytes = kNorm ? kNormRowOffset + 2 * static_cast<size_t>(k) : kSharedBytes;
  const unsigned grid =
      static_cast<unsigned>(std::min<int64_t>(Items<kOut>(n), int64_t{sms} * kCtasPerSm));
  return pdl::Launch(kernel, dim3(grid), dim3(kThreads), bytes, stream, pdl, x,
                     static_cast<const __nv_bfloat16*>(w), bias, y, n, k, accumulate, norm, rope,
                     schedule);
}

template <Out kOut>
cudaError_t LaunchOut(const void* x, const void* w, const void* bias, void* y, int64_t n, int64_t k,
                      bool accumulate, int sms, bool pdl, cudaStream_t stream, const GemvNorm& norm,
                      const GemvRope& rope, const GemvSchedule& schedule) {
  return norm.weight != nullptr ? Launch<kOut, true>(x, w, bias, y, n, k, accumulate, sms, pdl,
                                                     stream, norm, rope, schedule)
                                : Launch<kOut, false>(x, w, bias, y, n, k, accumulate, sms, pdl,
                                                      stream, norm, rope, schedule);
}

}  // namespace

int64_t GemvBulkNormMaxK() { return kNormMaxK; }

cudaError_t GemvBf16Bulk(const void* x, const void* w, const void* bias, void* y, int64_t n,
                         int64_t k, bool f32_out, bool accumulate, int sms, bool pdl,
                         cudaStream_t stream, const GemvNorm& norm, const GemvSchedule& schedule) {
  return f32_out ? LaunchOut<Out::kF32>(x, w, bias, y, n, k, accumulate, sms, pdl, stream, norm, {},
                                        schedule)
                 : LaunchOut<Out::kBf16>(x, w, bias, y, n, k, accumulate, sms, pdl, stream, norm,
                                         {}, schedule);
}

cudaError_t GemvSiluMulBulk(const void* x, const void* w, const void* bias, void* y, int64_t n,
                            int64_t k, int sms, bool pdl, cudaStream_t stream, const GemvNorm& norm,
                            const GemvSchedule& schedule) {
  return LaunchOut<Out::kSiluMulBf16>(x, w, bias, y, n, k, /*accumulate=*/false, sms, pdl, stream,
                                      norm, {}, schedule);
}

cudaError_t GemvRopeBulk(const void* x, const void* w, const void* bias, void* y, int64_t n,
                         int64_t k, int sms, bool pdl, cudaStream_t stream, const GemvNorm& norm,
                         const GemvRope& rope, const GemvSchedule& schedule) {
  if (rope.head_dim <= 0 || rope.head_dim % kItemRows != 0 ||
      int64_t{rope.rope_heads} * rope.head_dim > n || rope.positions == nullptr ||
      rope.inv_freq == nullptr ||
      (rope.kv.base != nullptr && (rope.kv.slots == nullptr || rope.kv.block_size <= 0))) {
    return cudaErrorInvalidValue;
  }
  return LaunchOut<Out::kRopeBf16>(x, w, bias, y, n, k, /*accumulate=*/false, sms, pdl, stream,
                                   norm, rope, schedule);
}

}  // namespace trident::kernels::cuda::internal
