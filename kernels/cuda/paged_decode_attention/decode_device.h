#ifndef TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_DECODE_DEVICE_H_
#define TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_DECODE_DEVICE_H_

// Device code the bf16 and FP8 decode kernels share (nvcc only): cp.async,
// the split's token range, the end of an mma kernel (its warps merged
// through shared memory and the output or partial written), and the
// once-per-device shared memory opt-in.

#ifdef __CUDACC__

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/cuda/arch/shared_memory.h"
#include "kernels/cuda/paged_decode_attention/paged_decode_attention_kernel.h"
#include "kernels/cuda/wgmma/wgmma_device.h"

namespace trident::kernels::cuda::internal {

__device__ __forceinline__ void CpAsync16Shared(uint32_t saddr, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(saddr), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Division of 32-bit non-negative numbers below 2^31 by a divisor fixed for
// the kernel (block_size) with a multiply and a shift: the quotient is
// (umulhi(n, mul) + n) >> shift, exact for n, d < 2^31.
struct FastDivisor {
  uint32_t d;
  uint32_t mul;
  uint32_t shift;
};

__device__ __forceinline__ FastDivisor MakeFastDivisor(uint32_t d) {
  uint32_t shift = 0;
  while ((uint64_t{1} << shift) < d) ++shift;
  const uint32_t mul =
      static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  return FastDivisor{d, mul, shift};
}

__device__ __forceinline__ uint32_t FastDiv(uint32_t n, const FastDivisor& v) {
  return (__umulhi(n, v.mul) + n) >> v.shift;
}

// The tokens [begin, end) of `split` of sequence `seq`: the context (clamped
// to the block table) cut into num_splits pieces of a multiple of kChunk.
// `context` (when given) gets the clamped context.
template <int kChunk>
__device__ __forceinline__ void SplitRange(const DecodeKernelParams& p, int seq, int split,
                                           int64_t* begin, int64_t* end,
                                           int64_t* context = nullptr) {
  const int64_t table_cap = static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size;
  int64_t ctx = p.context_lens[seq];
  ctx = ctx < 0 ? 0 : (ctx > table_cap ? table_cap : ctx);
  if (context != nullptr) *context = ctx;
  int64_t per_split = (ctx + p.num_splits - 1) / p.num_splits;
  per_split = (per_split + kChunk - 1) / kChunk * kChunk;
  const int64_t split_begin = split * per_split;
  *begin = split_begin < ctx ? split_begin : ctx;
  *end = *begin + per_split < ctx ? *begin + per_split : ctx;
}

// Element d of head h's result for one split of sequence `seq`: the bf16
// output row when the context is not split, else the f32 partial, with the
// split's (max, denominator) beside it once per row (d == 0).
__device__ __forceinline__ void StoreSplitResult(const DecodeKernelParams& p, int seq, int split,
                                                 int h, int hd, int d, float value, float max,
                                                 float denom) {
  if (p.partial_out == nullptr) {
    static_cast<__nv_bfloat16*>(
        p.out)[static_cast<int64_t>(seq) * p.out_stride + static_cast<int64_t>(h) * hd + d] =
        __float2bfloat16_rn(value);
    return;
  }
  const int64_t out_row = (static_cast<int64_t>(seq) * p.num_q_heads + h) * p.num_splits + split;
  p.partial_out[out_row * hd + d] = value;
  if (d == 0) {
    p.partial_stats[2 * out_row] = max;
    p.partial_stats[2 * out_row + 1] = denom;
  }
}

// The warps' partials MergeWarps reduces, in `smem` (kMergeWarpsBytes):
// each warp's output as [8 q heads][kHeadDim] floats, then its (max, sum)
// per q head. StageWarpTiles writes them from the mma layout.
// `warp`, `row` and `quad` are the calling thread's warp and its lane's
// l / 4 and l % 4 (the mma fragments' row and column pair).
template <int kHeadDim, int kNumWarps>
struct StagedWarps {
  float* o;  // [kNumWarps][8][kHeadDim]
  float* m;  // [kNumWarps][8]
  float* l;  // [kNumWarps][8]
  int warp;
  int row;
  int quad;
  __device__ __forceinline__ explicit StagedWarps(unsigned char* smem)
      : o(reinterpret_cast<float*>(smem)),
        m(o + kNumWarps * 8 * kHeadDim),
        l(m + kNumWarps * 8),
        warp(static_cast<int>(threadIdx.x) / 32),
        row(static_cast<int>(threadIdx.x) % 32 / 4),
        quad(static_cast<int>(threadIdx.x) % 4) {}
};

// Each warp's (max, sum) of head `row` and its output tiles acc (dims
// 8 nt + 2 quad + {0, 1}) into StagedWarps.
template <int kHeadDim, int kNumWarps>
__device__ __forceinline__ void StageWarpTiles(unsigned char* smem,
                                               const float (&acc)[kHeadDim / 8][2], float run_max,
                                               float run_sum) {
  const StagedWarps<kHeadDim, kNumWarps> staged(smem);
  const int head = staged.warp * 8 + staged.row;
#pragma unroll
  for (int nt = 0; nt < kHeadDim / 8; ++nt) {
    *reinterpret_cast<float2*>(staged.o + head * kHeadDim + 8 * nt + 2 * staged.quad) =
        make_float2(acc[nt][0], acc[nt][1]);
  }
  if (staged.quad == 0) {
    staged.m[head] = run_max;
    staged.l[head] = run_sum;
  }
}

// The staged warps (StagedWarps, once every warp has written) merged:
// store(g, d, value, max, denom) for each element d < hd of q head g of the
// group, value normalized.
template <int kHeadDim, int kNumWarps, typename Store>
__device__ __forceinline__ void ReduceStagedWarps(const DecodeKernelParams& p, unsigned char* smem,
                                                  int hd, Store store) {
  const StagedWarps<kHeadDim, kNumWarps> staged(smem);
  __syncthreads();
  for (int i = threadIdx.x; i < p.group * kHeadDim; i += kNumWarps * 32) {
    const int g = i / kHeadDim;
    const int d = i % kHeadDim;
    if (d >= hd) continue;
    float max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kNumWarps; ++w) max = fmaxf(max, staged.m[w * 8 + g]);
    float denom = 0.0f;
    float total = 0.0f;
    if (max != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kNumWarps; ++w) {
        const float weight = exp2f(staged.m[w * 8 + g] - max);  // 0 for a warp without tokens.
        denom = fmaf(weight, staged.l[w * 8 + g], denom);
        total = fmaf(weight, staged.o[(w * 8 + g) * kHeadDim + d], total);
      }
    }
    store(g, d, denom > 0.0f ? total / denom : 0.0f, max, denom);
  }
}

// Each warp's (max, sum) of head `row` and its output tiles acc (dims
// 8 nt + 2 quad + {0, 1}) merged over the warps through `smem`
// (kMergeWarpsBytes, free by now): store(g, d, value, max, denom) for each
// element d < hd of q head g of the group, value normalized.
template <int kHeadDim, int kNumWarps, typename Store>
__device__ __forceinline__ void MergeWarps(const DecodeKernelParams& p, unsigned char* smem,
                                           const float (&acc)[kHeadDim / 8][2], float run_max,
                                           float run_sum, int hd, Store store) {
  StageWarpTiles<kHeadDim, kNumWarps>(smem, acc, run_max, run_sum);
  ReduceStagedWarps<kHeadDim, kNumWarps>(p, smem, hd, store);
}

// The end of an mma kernel: each warp's (max, sum) of head `row` and its
// output tiles acc (dims 8 nt + 2 quad + {0, 1}) are merged over the warps
// through `smem` (kNumWarps * (8 * kHeadDim + 16) floats, free by now), and
// the CTA writes the bf16 output (one split) or the normalized partial and
// its (max, sum) for the merge kernel. Dims past hd are not written.
template <int kHeadDim, int kNumWarps>
__device__ __forceinline__ void MergeWarpsAndWrite(const DecodeKernelParams& p, unsigned char* smem,
                                                   const float (&acc)[kHeadDim / 8][2],
                                                   float run_max, float run_sum, int hd,
                                                   int kv_head, int split, int seq) {
  MergeWarps<kHeadDim, kNumWarps>(
      p, smem, acc, run_max, run_sum, hd, [&](int g, int d, float value, float max, float denom) {
        StoreSplitResult(p, seq, split, kv_head * p.group + g, hd, d, value, max, denom);
      });
}

// q of the kv head's group as the mma kernels' A fragments: qa[ks][0] =
// pack(q[row][16 ks + 2 quad + {0, 1}]), qa[ks][1] the pair 8 dims on;
// zero for rows past the group and dims past hd. Each pair is one 4-byte
// load where q and its stride allow it (the same for every thread). Every
// load is issued before any is packed: q is read right after the wait on
// the kernel ahead, and loads consumed one by one would cost a round trip
// each.
template <int kKSteps, typename Pack>
__device__ __forceinline__ void LoadQFragments(const DecodeKernelParams& p, int seq, int kv_head,
                                               int row, int quad, int hd, Pack pack,
                                               uint32_t (&qa)[kKSteps][2]) {
  const __nv_bfloat16* q_row = static_cast<const __nv_bfloat16*>(p.q) +
                               static_cast<int64_t>(seq) * p.q_stride +
                               static_cast<int64_t>(kv_head * p.group + row) * hd + 2 * quad;
  const bool paired = ((reinterpret_cast<uintptr_t>(p.q) | (p.q_stride * 2)) & 3) == 0;
  __nv_bfloat162 pairs[kKSteps][2];
  if (paired) {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const bool live = row < p.group && 16 * ks < hd;
        const __nv_bfloat162* at =
            reinterpret_cast<const __nv_bfloat162*>(q_row + 16 * ks + 8 * half);
        pairs[ks][half] = live ? __ldg(at) : __floats2bfloat162_rn(0.0f, 0.0f);
      }
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const bool live = row < p.group && 16 * ks < hd;
        const __nv_bfloat16* at = q_row + 16 * ks + 8 * half;
        pairs[ks][half].x = live ? at[0] : __float2bfloat16_rn(0.0f);
        pairs[ks][half].y = live ? at[1] : __float2bfloat16_rn(0.0f);
      }
    }
  }
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const bool live = row < p.group && 16 * ks < hd;
      qa[ks][half] = live ? pack(pairs[ks][half]) : 0u;
    }
  }
}

// The shared memory MergeWarps takes.
template <int kHeadDim, int kNumWarps>
inline constexpr int kMergeWarpsBytes = kNumWarps*(8 * kHeadDim + 16) * 4;

// The end of a kMmaCluster kernel: its warps merged as MergeWarpsAndWrite
// merges them, each CTA's normalized result and (max, sum) per q head kept
// in its shared memory past MergeWarps' (kMergeWarpsBytes, then
// (8 * kHeadDim + 16) floats); then the cluster's CTAs (the splits, in
// rank order) each merge a share of the group's elements over every split's
// result through distributed shared memory and write it in bf16. The
// merge kernel's arithmetic (DecodeMergeKernel).
template <int kHeadDim, int kNumWarps>
__device__ __forceinline__ void MergeClusterAndWrite(const DecodeKernelParams& p,
                                                     unsigned char* smem,
                                                     const float (&acc)[kHeadDim / 8][2],
                                                     float run_max, float run_sum, int hd,
                                                     int kv_head, int split, int seq) {
  float* const mine = reinterpret_cast<float*>(smem + kMergeWarpsBytes<kHeadDim, kNumWarps>);
  float* const stats = mine + 8 * kHeadDim;  // (max, sum) per q head of the group
  MergeWarps<kHeadDim, kNumWarps>(p, smem, acc, run_max, run_sum, hd,
                                  [&](int g, int d, float value, float max, float denom) {
                                    mine[g * kHeadDim + d] = value;
                                    if (d == 0) {
                                      stats[2 * g] = max;
                                      stats[2 * g + 1] = denom;
                                    }
                                  });
  wgmma::ClusterSync();
  const int splits = p.num_splits;
  const int threads = kNumWarps * 32;
  for (int i = split * threads + static_cast<int>(threadIdx.x); i < p.group * kHeadDim;
       i += splits * threads) {
    const int g = i / kHeadDim;
    const int d = i % kHeadDim;
    if (d >= hd) continue;
    // Every split's (max, sum) and value, their loads all in flight at once
    // (one round trip through the cluster, not one per split).
    float2 ml[kMaxClusterSplits];
    float value[kMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (s < splits) {
        ml[s] = wgmma::LoadClusterSharedPair(wgmma::ClusterSharedAddress(stats + 2 * g, s));
        value[s] = wgmma::LoadClusterShared(wgmma::ClusterSharedAddress(mine + i, s));
      }
    }
    float global_max = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (s < splits) global_max = fmaxf(global_max, ml[s].x);
    }
    float num = 0.0f;
    float den = 0.0f;
    if (global_max != -INFINITY) {
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        if (s < splits && ml[s].y > 0.0f) {
          const float w = exp2f(ml[s].x - global_max) * ml[s].y;
          num = fmaf(w, value[s], num);
          den += w;
        }
      }
    }
    static_cast<__nv_bfloat16*>(p.out)[static_cast<int64_t>(seq) * p.out_stride +
                                       static_cast<int64_t>(kv_head * p.group + g) * hd + d] =
        __float2bfloat16_rn(den > 0.0f ? num / den : 0.0f);
  }
  // No CTA leaves while another may still read its shared memory.
  wgmma::ClusterSync();
}

// With stable_prefix: the newest position of the context (this step's token,
// which the kernel ahead may have written) when the prologue of a warp's
// pipeline (its first kPrefetched chunks, copied before the wait) covered
// it. Load (after the wait) reads its K and V rows into registers and Store
// writes them over the stale copy in the landed stage, in the mma kernels'
// layout ([token][head_dim] tiles, 16-byte piece c of row r at c ^ (r % 8)).
template <int kHeadDim>
struct NewestRow {
  static constexpr int kRowPieces = kHeadDim / 8;
  static constexpr int kPerLane = (2 * kRowPieces + 31) / 32;
  int chunk = -1;  // the warp's chunk (its i) holding the row; -1: none
  int row = 0;     // the row in that chunk
  int hd = 0;
  uint4 piece[kPerLane];

  template <int kNumWarps, int kPrefetched>
  __device__ __forceinline__ void Load(const DecodeKernelParams& p, const __nv_bfloat16* kv,
                                       const int32_t* table, int kv_head, int head_dim,
                                       int64_t begin, int64_t end, int64_t context, int warp,
                                       int lane) {
    const int64_t t = context - 1;
    if (t < begin || t >= end) return;
    const int c = static_cast<int>((t - begin) / 16);
    if (c % kNumWarps != warp || c / kNumWarps >= kPrefetched) return;
    chunk = c / kNumWarps;
    row = static_cast<int>(t % 16);  // chunks start at multiples of 16
    hd = head_dim;
    const int32_t block = table[t / p.block_size];
    const __nv_bfloat16* k_row =
        kv + static_cast<int64_t>(block) * p.block_stride +
        (static_cast<int64_t>(kv_head) * p.block_size + t % p.block_size) * head_dim;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = lane + 32 * j;
      const int c8 = e % kRowPieces;
      if (e < 2 * kRowPieces && c8 * 8 < head_dim) {
        piece[j] = __ldcg(reinterpret_cast<const uint4*>(
            k_row + (e >= kRowPieces ? p.value_offset : 0) + c8 * 8));
      }
    }
  }

  // `stage`: the chunk's K tile, its V tile tile_bytes further.
  __device__ __forceinline__ void Store(unsigned char* stage, int tile_bytes, int lane) const {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = lane + 32 * j;
      const int c8 = e % kRowPieces;
      if (e < 2 * kRowPieces && c8 * 8 < hd) {
        *reinterpret_cast<uint4*>(stage + (e >= kRowPieces ? tile_bytes : 0) + row * kHeadDim * 2 +
                                  ((c8 ^ (row & 7)) * 16)) = piece[j];
      }
    }
  }
};

}  // namespace trident::kernels::cuda::internal

#endif  // __CUDACC__

#endif  // TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_DECODE_DEVICE_H_
