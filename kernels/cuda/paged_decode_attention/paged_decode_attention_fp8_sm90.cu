// Decode attention over the FP8 E4M3 cache on Hopper's FP8 tensor cores
// (wgmma, sm_90a): the stored bytes are MMA operands as they are, with no
// conversion to fp16 (the cost that bounds the mma.sync FP8 kernel).
//
// The products are taken transposed, so the 64 rows of a wgmma are tokens or
// dims and its N columns the q heads of the kv head (at most 8):
//   S^T = K Q^T    A = a 64-token K tile in shared memory, 128-byte swizzled
//                  (cp.async places each 16-byte piece), K-major over dims;
//                  B = q in E4M3 as two terms, hi (columns 0-7) and lo
//                  (columns 8-15, 16x the residual), per head scaled by its
//                  largest |q| / 448, dims in the cache's fragment order;
//   O^T += V^T P^T A = V's stored 16-token groups ([dim][16 bytes]: already
//                  no-swizzle K-major core matrices), B = P in E4M3 as hi and
//                  lo terms times each token's V scale over the running
//                  largest V scale (the "unit"), in the groups' token order.
// One warpgroup per (kv head, split, sequence) walks the split in 64-token
// tiles through kStages cp.async stages. The online softmax keeps a running
// max per head across the warps (one shared-memory exchange per tile);
// every warp's O rows are distinct dims, so nothing is merged at the end.

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "common/numeric/fp8_fragment.h"
#include "kernels/cuda/paged_decode_attention/decode_device.h"
#include "kernels/cuda/paged_decode_attention/paged_decode_attention_kernel.h"
#include "kernels/cuda/pdl/pdl_device.h"
#include "kernels/cuda/wgmma/wgmma_device.h"

namespace trident::kernels::cuda::internal {
namespace {

constexpr int kHeadDim = 128;
constexpr int kTile = 64;  // Tokens per tile: the wgmma's M for S^T.
constexpr int kStages = 4;
constexpr int kThreads = 128;
constexpr int kN = 16;  // Columns: 8 heads' hi terms, then their lo terms.
constexpr int kKBytes = kTile * kHeadDim;
constexpr int kVBytes = kHeadDim * kTile;
constexpr int kScaleBytes = 2 * kTile * 4;
constexpr int kQBytes = (kHeadDim / 16) * kN * 16;
constexpr int kPBytes = (kTile / 16) * kN * 16;
constexpr int kKOffset = 0;
constexpr int kVOffset = kKOffset + kStages * kKBytes;
constexpr int kScaleOffset = kVOffset + kStages * kVBytes;
constexpr int kQOffset = kScaleOffset + kStages * kScaleBytes;
constexpr int kPOffset = kQOffset + kQBytes;
constexpr int kReduceOffset = kPOffset + kPBytes;
// Per warp: 8 heads' tile max and the tile's largest V scale; then the 8
// heads' q scales; at the end the 8 heads' sums.
constexpr int kSmemBytes = kReduceOffset + (4 * 9 + 8 + 4 * 8) * 4;
// The lo terms are 16x the residual of the hi terms.
constexpr float kLoScale = 16.0f;
// P's terms are the probability times (V scale / unit) times this (<= 448).
constexpr float kPScale = 256.0f;

// d (+)= A B^T for A 64 x 32 and B 16 x 32 E4M3, both K-major in shared
// memory (descriptors a and b); d as the m64n16 f32 accumulator fragment.
__device__ __forceinline__ void MmaM64N16K32E4m3(uint64_t a, uint64_t b, float (&d)[8],
                                                 bool accumulate) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

// Two floats as E4M3 bytes (saturating), `lo` in the low byte.
__device__ __forceinline__ uint32_t ToE4m3x2(float lo, float hi) {
  return static_cast<uint32_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float E4m3ToFloat(uint32_t byte) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte), __NV_E4M3);
  return __half2float(__half(h));
}

// x as the hi and lo E4M3 bytes (lo = E4M3(16 (x - hi))).
__device__ __forceinline__ void SplitE4m3(float x, uint32_t& hi, uint32_t& lo) {
  hi = ToE4m3x2(x, 0.0f) & 0xffu;
  lo = ToE4m3x2((x - E4m3ToFloat(hi)) * kLoScale, 0.0f) & 0xffu;
}

// q of the kv head's heads into shared memory as Q^T's B operand: for dim
// group c (16 dims) the 16 rows (hi of heads 0-7, lo of heads 0-7) of 16
// bytes, each row's dims in fragment order; the heads' q scales to
// `q_scales`. Thread: head tid / 16, dims 8 (tid % 16) .. + 7.
__device__ __forceinline__ void StageQ(const DecodeKernelParams& p, int seq, int kv_head,
                                       unsigned char* sq, float* q_scales) {
  const int head = threadIdx.x / 16;
  const int d0 = 8 * (threadIdx.x % 16);
  float x[8] = {};
  if (head < p.group) {
    const __nv_bfloat16* q = static_cast<const __nv_bfloat16*>(p.q) +
                             static_cast<int64_t>(seq) * p.q_stride +
                             static_cast<int64_t>(kv_head * p.group + head) * kHeadDim + d0;
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = __bfloat162float(q[e]);
  }
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(x[e]));
#pragma unroll
  for (int offset = 1; offset < 16; offset *= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  if (threadIdx.x % 16 == 0) q_scales[head] = scale;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int d = d0 + e;
    uint32_t hi;
    uint32_t lo;
    SplitE4m3(x[e] / scale, hi, lo);
    unsigned char* group = sq + (d / 16) * (kN * 16);
    const int at = numeric::Fp8FragmentPosition(d % 16);
    group[head * 16 + at] = static_cast<unsigned char>(hi);
    group[(8 + head) * 16 + at] = static_cast<unsigned char>(lo);
  }
}

struct TileSource {
  const unsigned char* kv;
  const int32_t* table;
  int64_t begin;
  int64_t end;
  FastDivisor block_div;  // by the block size
};

// Where each of a tile's kTile / 16 token groups starts: its block's bytes
// and its first slot. A group lies in one block (the block size is a
// multiple of 16), so one table lookup and one division per group give every
// piece's address. Groups past the split's end are not looked up.
struct TileGroups {
  const unsigned char* block[kTile / 16];
  int slot[kTile / 16];
};

__device__ __forceinline__ TileGroups LocateGroups(const DecodeKernelParams& p,
                                                   const TileSource& src, int64_t tok0) {
  TileGroups t;
#pragma unroll
  for (int g = 0; g < kTile / 16; ++g) {
    const int64_t pos = tok0 + 16 * g;
    t.block[g] = src.kv;
    t.slot[g] = 0;
    if (pos < src.end) {
      const uint32_t b = FastDiv(static_cast<uint32_t>(pos), src.block_div);
      t.block[g] = src.kv + static_cast<int64_t>(__ldg(src.table + b)) * p.block_stride;
      t.slot[g] = static_cast<int>(pos - static_cast<int64_t>(b) * p.block_size);
    }
  }
  return t;
}

// Starts the copies of tile `it` into `stage`: K rows (zero past the
// split's end), V's 16-token groups (zero when wholly past it; a group cut
// by the end is cleaned after it lands) and the tokens' K and V scales.
__device__ __forceinline__ void IssueTile(const DecodeKernelParams& p, const TileSource& src,
                                          int kv_head, int it, int stage, unsigned char* smem) {
  const int tid = threadIdx.x;
  const int bs = p.block_size;
  const int64_t tok0 = src.begin + static_cast<int64_t>(it) * kTile;
  const TileGroups groups = LocateGroups(p, src, tok0);
  const uint32_t k_dst = wgmma::SharedAddress(smem + kKOffset + stage * kKBytes);
  const uint32_t v_dst = wgmma::SharedAddress(smem + kVOffset + stage * kVBytes);
  const uint32_t s_dst = wgmma::SharedAddress(smem + kScaleOffset + stage * kScaleBytes);
  // K: piece j of the thread is row tid / 8 of group j, 16 bytes at tid % 8.
  static_assert(kTile * 8 / kThreads == kTile / 16, "a K piece per group and thread");
  const int64_t head_row = static_cast<int64_t>(kv_head) * bs;
#pragma unroll
  for (int j = 0; j < kTile / 16; ++j) {
    const int r = 16 * j + tid / 8;
    const int c = tid % 8;
    const bool ok = tok0 + r < src.end;
    const int64_t offset = (head_row + groups.slot[j] + tid / 8) * 128 + c * 16;
    CpAsync16Shared(k_dst + wgmma::Swizzle128Offset(r, c), ok ? groups.block[j] + offset : src.kv,
                    ok);
  }
  // V: the thread's 16 bytes of each group.
  const int64_t head_group = static_cast<int64_t>(kv_head) * (bs / 16);
#pragma unroll
  for (int g = 0; g < kTile / 16; ++g) {
    const bool ok = tok0 + 16 * g < src.end;
    const int64_t offset =
        p.value_offset + ((head_group + groups.slot[g] / 16) * kHeadDim + tid) * 16;
    CpAsync16Shared(v_dst + g * 2048 + tid * 16, ok ? groups.block[g] + offset : src.kv, ok);
  }
  if (tid < 32) {
    // Threads 0-15: the tile's K scales, 16-31: its V scales, 4 tokens each.
    const int which = tid / 16;
    const int g = (tid % 16) / 4;
    const int first = 4 * (tid % 4);
    const bool ok = tok0 + 16 * g + first < src.end;
    // The group picked without indexing by a variable (which would put the
    // arrays in local memory).
    const unsigned char* block = groups.block[0];
    int slot = groups.slot[0];
#pragma unroll
    for (int i = 1; i < kTile / 16; ++i) {
      if (g == i) {
        block = groups.block[i];
        slot = groups.slot[i];
      }
    }
    const int64_t offset =
        p.scale_offset + ((which * p.num_kv_heads + kv_head) * int64_t{bs} + slot + first) * 4;
    CpAsync16Shared(s_dst + tid * 16, ok ? block + offset : src.kv, ok);
  }
}

// The running softmax of the thread's two heads (2 quad, 2 quad + 1).
struct Running {
  float max[2];
  float sum[2];  // This thread's tokens.
  float unit;    // O is kept in units of unit / kPScale.
};

template <bool kAccumulate>
__device__ __forceinline__ void IssueProducts(uint64_t (&a)[4], uint64_t (&b)[4], float (&d)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) MmaM64N16K32E4m3(a[i], b[i], d, kAccumulate || i > 0);
}

__global__ void __launch_bounds__(kThreads) DecodeFp8WgmmaKernel(const DecodeKernelParams p) {
  extern __shared__ __align__(1024) unsigned char smem[];
  pdl::LetDependentsLaunchThenWait();
  const int kv_head = blockIdx.x;
  const int split = blockIdx.y;
  const int seq = blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int quad = lane % 4;
  float* const red_max = reinterpret_cast<float*>(smem + kReduceOffset);  // [warp][9]
  float* const q_scales = red_max + 4 * 9;                                // [8]
  float* const red_sum = q_scales + 8;                                    // [warp][8]

  TileSource src;
  SplitRange<kTile>(p, seq, split, &src.begin, &src.end);
  src.kv = static_cast<const unsigned char*>(p.kv);
  src.table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  src.block_div = MakeFastDivisor(static_cast<uint32_t>(p.block_size));
  const int num_tiles = static_cast<int>((src.end - src.begin + kTile - 1) / kTile);

  StageQ(p, seq, kv_head, smem + kQOffset, q_scales);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_tiles) IssueTile(p, src, kv_head, s, s, smem);
    CpAsyncCommit();
  }
  __syncthreads();  // q and its scales.
  float qs[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) qs[e] = q_scales[2 * quad + e] * p.scale_log2 / kLoScale;

  Running run{{-INFINITY, -INFINITY}, {0.0f, 0.0f}, 0.0f};
  float o[2][8] = {};            // Dims 64 mh + 16 warp + g (+ 8): O^T's fragment.
  const int r0 = 16 * warp + g;  // The thread's tokens in a tile: r0, r0 + 8.
  for (int it = 0; it < num_tiles; ++it) {
    const int stage = it % kStages;
    if (it + kStages - 1 < num_tiles) {
      IssueTile(p, src, kv_head, it + kStages - 1, (it + kStages - 1) % kStages, smem);
    }
    CpAsyncCommit();
    CpAsyncWait<kStages - 1>();
    const int64_t tok0 = src.begin + static_cast<int64_t>(it) * kTile;
    const int valid = static_cast<int>(src.end - tok0 < kTile ? src.end - tok0 : kTile);
    unsigned char* const vt = smem + kVOffset + stage * kVBytes;
    if (valid % 16 != 0) {
      // The group the split's end cuts: clear its bytes past the end (stale,
      // perhaps NaN; 0 x NaN is NaN in the product).
      uint4* row = reinterpret_cast<uint4*>(vt + (valid / 16) * 2048 + threadIdx.x * 16);
      uint4 bytes = *row;
      uint32_t* words = &bytes.x;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        if (i >= valid % 16) {
          const int at = numeric::Fp8FragmentPosition(i);
          words[at / 4] &= ~(0xffu << (8 * (at % 4)));
        }
      }
      *row = bytes;
    }
    wgmma::FenceSharedForAsync();
    __syncthreads();

    // S^T: tokens r0, r0 + 8; columns 2 quad (+1) hi, 8 + 2 quad (+1) lo.
    float s8[8];
    {
      uint64_t a[4];
      uint64_t b[4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        a[ks] = wgmma::Swizzle128Descriptor(smem + kKOffset + stage * kKBytes + ks * 32, 1024);
        b[ks] = wgmma::NoSwizzleDescriptor(smem + kQOffset + ks * 2 * (kN * 16), kN * 16, 128);
      }
      wgmma::Fence();
      IssueProducts<false>(a, b, s8);
      wgmma::CommitGroup();
      wgmma::WaitGroup<0>();
    }
    const float* k_scales =
        reinterpret_cast<const float*>(smem + kScaleOffset + stage * kScaleBytes);
    const float* v_scales = k_scales + kTile;
    float sc[2][2];  // [token][head], base 2.
    float vs[2];
    float tile_max[2] = {-INFINITY, -INFINITY};
    float tile_unit = 0.0f;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int r = r0 + 8 * t;
      const bool live = r < valid;
      vs[t] = live ? v_scales[r] : 0.0f;
      tile_unit = fmaxf(tile_unit, vs[t]);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float raw = s8[2 * t + e] * kLoScale + s8[4 + 2 * t + e];
        sc[t][e] = live ? raw * k_scales[r] * qs[e] : -INFINITY;
        tile_max[e] = fmaxf(tile_max[e], sc[t][e]);
      }
    }
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        tile_max[e] = fmaxf(tile_max[e], __shfl_xor_sync(0xffffffffu, tile_max[e], offset));
      }
    }
#pragma unroll
    for (int offset = 1; offset < 32; offset *= 2) {
      tile_unit = fmaxf(tile_unit, __shfl_xor_sync(0xffffffffu, tile_unit, offset));
    }
    if (g == 0) {
      red_max[warp * 9 + 2 * quad] = tile_max[0];
      red_max[warp * 9 + 2 * quad + 1] = tile_max[1];
    }
    if (lane == 0) red_max[warp * 9 + 8] = tile_unit;
    __syncthreads();
    float new_max[2];
    float alpha[2];
    float unit = run.unit;
#pragma unroll
    for (int w = 0; w < 4; ++w) unit = fmaxf(unit, red_max[w * 9 + 8]);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      new_max[e] = run.max[e];
#pragma unroll
      for (int w = 0; w < 4; ++w) new_max[e] = fmaxf(new_max[e], red_max[w * 9 + 2 * quad + e]);
      const float shift = new_max[e] == -INFINITY ? 0.0f : new_max[e];
      alpha[e] = exp2f(run.max[e] - shift);
      run.max[e] = new_max[e];
      run.sum[e] *= alpha[e];
    }
    const float unit_or_one = unit > 0.0f ? unit : 1.0f;
    // P^T: token r of group r / 16 at byte numeric::Fp8FragmentPosition(r % 16) of rows
    // 2 quad + e (hi) and 8 + 2 quad + e (lo).
    unsigned char* const sp = smem + kPOffset;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int r = r0 + 8 * t;
      unsigned char* const group = sp + (r / 16) * (kN * 16);
      const int at = numeric::Fp8FragmentPosition(r % 16);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float shift = new_max[e] == -INFINITY ? 0.0f : new_max[e];
        const float prob = exp2f(sc[t][e] - shift);
        run.sum[e] += prob;
        uint32_t hi;
        uint32_t lo;
        SplitE4m3(prob * (vs[t] / unit_or_one) * kPScale, hi, lo);
        group[(2 * quad + e) * 16 + at] = static_cast<unsigned char>(hi);
        group[(8 + 2 * quad + e) * 16 + at] = static_cast<unsigned char>(lo);
      }
    }
    // O (in units of run.unit / kPScale) to units of unit / kPScale.
    const float ratio = run.unit / unit_or_one;
    run.unit = unit_or_one;
#pragma unroll
    for (int mh = 0; mh < 2; ++mh) {
#pragma unroll
      for (int i = 0; i < 8; ++i) o[mh][i] *= alpha[i % 2] * ratio;
    }
    wgmma::FenceSharedForAsync();
    __syncthreads();  // P^T written; the maxima read.
    {
      wgmma::Fence();
#pragma unroll
      for (int mh = 0; mh < 2; ++mh) {
        uint64_t a[4];
        uint64_t b[4];
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
          a[ks] = wgmma::NoSwizzleDescriptor(vt + 2 * ks * 2048 + mh * 1024, 2048, 128);
          b[ks] = wgmma::NoSwizzleDescriptor(sp + 2 * ks * (kN * 16), kN * 16, 128);
        }
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) MmaM64N16K32E4m3(a[ks], b[ks], o[mh], true);
      }
      wgmma::CommitGroup();
      wgmma::WaitGroup<0>();
    }
    __syncthreads();  // P^T and the stage are free for the next tile.
  }
  CpAsyncWait<0>();

  // The heads' sums over the warps.
#pragma unroll
  for (int e = 0; e < 2; ++e) {
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) {
      run.sum[e] += __shfl_xor_sync(0xffffffffu, run.sum[e], offset);
    }
  }
  if (g == 0) {
    red_sum[warp * 8 + 2 * quad] = run.sum[0];
    red_sum[warp * 8 + 2 * quad + 1] = run.sum[1];
  }
  __syncthreads();
  float denom[2] = {0.0f, 0.0f};
#pragma unroll
  for (int e = 0; e < 2; ++e) {
#pragma unroll
    for (int w = 0; w < 4; ++w) denom[e] += red_sum[w * 8 + 2 * quad + e];
  }
  const float to_o = run.unit / kPScale;
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int head = 2 * quad + e;
    if (head >= p.group) continue;
    const int h = kv_head * p.group + head;
    const float inv = denom[e] > 0.0f ? to_o / denom[e] : 0.0f;
#pragma unroll
    for (int mh = 0; mh < 2; ++mh) {
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int d = 64 * mh + 16 * warp + g + 8 * t;
        const float value = (o[mh][2 * t + e] + o[mh][4 + 2 * t + e] / kLoScale) * inv;
        StoreSplitResult(p, seq, split, h, kHeadDim, d, value, run.max[e], denom[e]);
      }
    }
  }
}

}  // namespace

bool Fp8WgmmaSupports(const DecodeKernelParams& p) {
  return p.fp8 && p.head_dim == kHeadDim && p.group <= 8 && p.block_size % 16 == 0;
}

cudaError_t LaunchFp8WgmmaSplit(const DecodeKernelParams& p, cudaStream_t stream) {
  static std::atomic<uint64_t> configured{0};
  const cudaError_t error =
      ConfigureSharedMemoryOnce(&DecodeFp8WgmmaKernel, kSmemBytes, configured);
  if (error != cudaSuccess) return error;
  const dim3 grid(static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(p.num_splits),
                  static_cast<unsigned>(p.batch));
  return pdl::Launch(&DecodeFp8WgmmaKernel, grid, dim3(kThreads), static_cast<size_t>(kSmemBytes),
                     stream, p.pdl, p);
}

}  // namespace trident::kernels::cuda::internal
