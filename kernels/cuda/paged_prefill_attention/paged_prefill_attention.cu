#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

#include "common/numeric/fp8_fragment.h"
#include "kernels/cuda/paged_prefill_attention/paged_prefill_attention_kernel.h"
#include "kernels/cuda/paged_prefill_attention/prefill_device.h"

namespace trident::kernels::cuda::internal {
namespace {

using prefill::CpAsync16;
using prefill::CpAsyncCommit;
using prefill::CpAsyncWait;
using prefill::PackBf16;
using prefill::SmemAddr;
using prefill::UpdateRowMax;

// Keys per KV tile: 4 blocks of 16 at the default block size.
constexpr int kBlockN = 64;

template <int kHeadDim, int kBlockM>
struct TileConfig {
  static constexpr int kWarps = kBlockM / 16;  // Each warp owns 16 query rows.
  static constexpr int kThreads = kWarps * 32;
  // Shared-memory rows are padded by 16 bytes so the 8 row addresses of an
  // ldmatrix fall in 8 different bank groups.
  static constexpr int kRowStride = kHeadDim + 8;
  static constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks.
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static constexpr int kQElems = kBlockM * kRowStride;
  static constexpr int kKvElems = kBlockN * kRowStride;
  // Q, then two buffers of (K, V).
  static constexpr int kSmemBytes = (kQElems + 4 * kKvElems) * 2;
  static_assert(kThreads % kChunksPerRow == 0, "a pass covers whole rows");
  static_assert(kBlockN % kRowsPerPass == 0 && kBlockM % kRowsPerPass == 0, "whole passes");
};

__device__ __forceinline__ void LdMatrixX4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                           uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                                uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// c += a (16x16, row-major fragment) * b (16x8, column-major fragment).
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ __nv_bfloat16 Fp8ToBf16(unsigned char byte, float scale) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte), __NV_E4M3);
  return __float2bfloat16_rn(__half2float(__half(h)) * scale);
}

// Loads keys [n0, n0 + kBlockN) of kv head `kv_head` from the FP8 cache into
// the bf16 tiles sk and sv ([key][kRowStride], as the bf16 path's cp.async
// leaves them): each (key, 16 dims) of K and each (dim, 16 keys) of V is one
// 16-byte load, dequantized with its token's scale. Keys at or past kv_end,
// and dims past hd, become zeros. A tile's keys lie in whole 16-token groups
// of one block (block_size is a multiple of 16).
template <int kHeadDim, int kThreads, int kRowStride>
__device__ __forceinline__ void LoadKvFp8(const PagedPrefillParams& p, const int32_t* table,
                                          int kv_head, int n0, int kv_end, int hd,
                                          __nv_bfloat16* sk, __nv_bfloat16* sv) {
  constexpr int kGroups = kHeadDim / 16;
  const unsigned char* kv = static_cast<const unsigned char*>(p.kv_base);
  const int bs = p.block_size;
  // K: kBlockN rows x kGroups groups of 16 dims.
  for (int item = threadIdx.x; item < kBlockN * kGroups; item += kThreads) {
    const int r = item / kGroups;
    const int group = item % kGroups;
    const int pos = n0 + r;
    __nv_bfloat16 values[16];
    if (pos < kv_end && group * 16 < hd) {
      const int slot = pos % bs;
      const unsigned char* block =
          kv + static_cast<int64_t>(table[pos / bs]) * p.block_stride_elems;
      const uint4 raw = *reinterpret_cast<const uint4*>(
          block + (static_cast<int64_t>(kv_head) * bs + slot) * hd + group * 16);
      const float scale = *reinterpret_cast<const float*>(
          block + p.scale_offset_elems + (static_cast<int64_t>(kv_head) * bs + slot) * 4);
      const unsigned char* bytes = reinterpret_cast<const unsigned char*>(&raw);
#pragma unroll
      for (int i = 0; i < 16; ++i)
        values[i] = Fp8ToBf16(bytes[numeric::Fp8FragmentPosition(i)], scale);
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) values[i] = __float2bfloat16_rn(0.0f);
    }
    uint4* dst = reinterpret_cast<uint4*>(sk + r * kRowStride + group * 16);
    dst[0] = *reinterpret_cast<const uint4*>(&values[0]);
    dst[1] = *reinterpret_cast<const uint4*>(&values[8]);
  }
  // V: kBlockN / 16 groups of keys x kHeadDim dims.
  for (int item = threadIdx.x; item < (kBlockN / 16) * kHeadDim; item += kThreads) {
    const int key_group = item / kHeadDim;
    const int d = item % kHeadDim;
    const int first = n0 + key_group * 16;
    unsigned char bytes[16] = {};
    float scales[16] = {};
    if (first < kv_end && d < hd) {
      const unsigned char* block =
          kv + static_cast<int64_t>(table[first / bs]) * p.block_stride_elems;
      const int slot = first % bs;
      *reinterpret_cast<uint4*>(bytes) = *reinterpret_cast<const uint4*>(
          block + p.value_offset_elems +
          ((static_cast<int64_t>(kv_head) * (bs / 16) + slot / 16) * hd + d) * 16);
      const float4* s = reinterpret_cast<const float4*>(
          block + p.scale_offset_elems +
          ((static_cast<int64_t>(p.num_kv_heads) + kv_head) * bs + slot) * 4);
#pragma unroll
      for (int i = 0; i < 4; ++i) *reinterpret_cast<float4*>(&scales[4 * i]) = s[i];
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const bool live = first + i < kv_end;
      sv[(key_group * 16 + i) * kRowStride + d] =
          live ? Fp8ToBf16(bytes[numeric::Fp8FragmentPosition(i)], scales[i])
               : __float2bfloat16_rn(0.0f);
    }
  }
}

// Fragment layouts (PTX ISA, mma.m16n8k16): lane = 4 * g + t. An fp32
// accumulator tile of 16x8 holds c[0..1] at (row g, cols 2t, 2t+1) and
// c[2..3] at (row g + 8, same cols). Each warp's S tile is 16 rows x 64 keys
// = 8 such tiles; its O tile is 16 rows x kHeadDim = kHeadDim / 8 tiles.
template <int kHeadDim, int kBlockM, bool kMasked, bool kFp8>
__global__ void __launch_bounds__(TileConfig<kHeadDim, kBlockM>::kThreads)
    PagedPrefillKernel(const PagedPrefillParams p) {
  using Cfg = TileConfig<kHeadDim, kBlockM>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* const sq = reinterpret_cast<__nv_bfloat16*>(smem_raw);

  // blockIdx.x (fastest) runs over heads, so the heads sharing a kv head run
  // side by side and share its tiles in L2; blockIdx.y runs over query tiles
  // heaviest (latest) first, so the causal triangle's long tail starts early.
  const int seq = blockIdx.z;
  const int head = blockIdx.x;
  const int m0 = (gridDim.y - 1 - blockIdx.y) * kBlockM;
  const int query_len = p.query_lens[seq];
  const int context_len = p.context_lens[seq];
  // The last check guards the block-table reads against a broken REQUIRES.
  if (m0 >= query_len || query_len > context_len ||
      context_len > p.max_blocks_per_seq * p.block_size) {
    return;
  }
  const int query_start = p.query_starts[seq];
  const int kv_head = head / (p.num_q_heads / p.num_kv_heads);
  const int rows = min(kBlockM, query_len - m0);
  // Positions of this tile's query rows: first_row_pos .. first_row_pos + rows - 1.
  const int first_row_pos = context_len - query_len + m0;
  const int kv_end = first_row_pos + rows;  // Keys [0, kv_end) are visible to some row.
  const int num_n_tiles = (kv_end + kBlockN - 1) / kBlockN;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int t = lane % 4;
  // ldmatrix: lane supplies row (lane % 8) of 8x8 matrix (lane / 8).
  const int lm_row = lane % 8;
  const int lm_mat = lane / 8;

  const __nv_bfloat16* const kv = static_cast<const __nv_bfloat16*>(p.kv_base);
  const int32_t* const table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int chunk = tid % Cfg::kChunksPerRow;
  const int pass_row = tid / Cfg::kChunksPerRow;
  // The model's head_dim (a multiple of 16, <= kHeadDim): dims past it are
  // zeros in the Q, K and V tiles, their k steps and output tiles skipped.
  const int hd = kMasked ? p.head_dim : kHeadDim;
  const bool chunk_live = chunk * 8 < hd;

  // Gathers keys [n_tile * kBlockN, +kBlockN) of the bf16 cache through the
  // block table into the tiles sk and sv; keys at or past kv_end become zeros.
  auto load_kv_bf16 = [&](int n_tile, __nv_bfloat16* sk, __nv_bfloat16* sv) {
#pragma unroll
    for (int pass = 0; pass < kBlockN / Cfg::kRowsPerPass; ++pass) {
      const int r = pass_row + pass * Cfg::kRowsPerPass;
      const int pos = n_tile * kBlockN + r;
      const bool valid = pos < kv_end && chunk_live;
      int64_t offset = 0;
      if (valid) {
        const int block_index = pos / p.block_size;
        const int slot = pos - block_index * p.block_size;
        offset = static_cast<int64_t>(table[block_index]) * p.block_stride_elems +
                 (static_cast<int64_t>(kv_head) * p.block_size + slot) * hd + chunk * 8;
      }
      const int smem_offset = r * Cfg::kRowStride + chunk * 8;
      CpAsync16(SmemAddr(sk + smem_offset), kv + offset, valid);
      CpAsync16(SmemAddr(sv + smem_offset), kv + (valid ? offset + p.value_offset_elems : 0),
                valid);
    }
  };
  // The same into buffer `buf`. The FP8 cache's loads are plain ones, done
  // when this returns; the barrier before the tile's use publishes them.
  auto load_kv = [&](int n_tile, int buf) {
    __nv_bfloat16* const sk = sq + Cfg::kQElems + buf * 2 * Cfg::kKvElems;
    __nv_bfloat16* const sv = sk + Cfg::kKvElems;
    if constexpr (kFp8) {
      LoadKvFp8<kHeadDim, Cfg::kThreads, Cfg::kRowStride>(p, table, kv_head, n_tile * kBlockN,
                                                          kv_end, hd, sk, sv);
    } else {
      load_kv_bf16(n_tile, sk, sv);
    }
  };

  {
    const __nv_bfloat16* const q = static_cast<const __nv_bfloat16*>(p.q);
#pragma unroll
    for (int pass = 0; pass < kBlockM / Cfg::kRowsPerPass; ++pass) {
      const int r = pass_row + pass * Cfg::kRowsPerPass;
      const bool valid = r < rows && chunk_live;
      const __nv_bfloat16* src = valid
                                     ? q + static_cast<int64_t>(query_start + m0 + r) * p.q_stride +
                                           static_cast<int64_t>(head) * hd + chunk * 8
                                     : q;
      CpAsync16(SmemAddr(sq + r * Cfg::kRowStride + chunk * 8), src, valid);
    }
  }
  load_kv(0, 0);
  CpAsyncCommit();

  const float scale_log2 = p.scale * 1.4426950408889634f;
  // Positions of this thread's two rows (g and g + 8 of the warp's 16).
  const int warp_first_pos = first_row_pos + warp * 16;
  const int pos0 = warp_first_pos + g;
  const int pos1 = pos0 + 8;
  // A warp whose rows are all padding, or a KV tile wholly above the warp's
  // part of the diagonal, is skipped by that warp (it still joins the loads
  // and barriers).
  const bool warp_has_rows = warp * 16 < rows;
  const int warp_last_pos = warp_first_pos + 15;

  uint32_t qf[kHeadDim / 16][4];
  float o[kHeadDim / 8][4];
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d) {
    o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  }
  float row_max[2] = {-INFINITY, -INFINITY};  // In log2 units (scores * scale_log2).
  float row_sum[2] = {0.0f, 0.0f};            // This thread's share; the quad sums at the end.

  for (int it = 0; it < num_n_tiles; ++it) {
    if (it + 1 < num_n_tiles) {
      load_kv(it + 1, (it + 1) & 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    if (it == 0) {
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        const int row = warp * 16 + (lm_mat & 1) * 8 + lm_row;
        const int col = kk * 16 + (lm_mat >> 1) * 8;
        LdMatrixX4(SmemAddr(sq + row * Cfg::kRowStride + col), qf[kk][0], qf[kk][1], qf[kk][2],
                   qf[kk][3]);
      }
    }
    const int n0 = it * kBlockN;
    if (warp_has_rows && n0 <= warp_last_pos) {
      const __nv_bfloat16* const sk = sq + Cfg::kQElems + (it & 1) * 2 * Cfg::kKvElems;
      const __nv_bfloat16* const sv = sk + Cfg::kKvElems;

      float s[kBlockN / 8][4];
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        if (16 * kk >= hd) break;  // Zero dims past head_dim.
#pragma unroll
        for (int np = 0; np < kBlockN / 16; ++np) {
          // Matrices: (keys +0..7, dims +0..7), (keys +0..7, dims +8..15),
          // (keys +8..15, dims +0..7), (keys +8..15, dims +8..15).
          const int key = np * 16 + (lm_mat >> 1) * 8 + lm_row;
          const int dim = kk * 16 + (lm_mat & 1) * 8;
          uint32_t b0, b1, b2, b3;
          LdMatrixX4(SmemAddr(sk + key * Cfg::kRowStride + dim), b0, b1, b2, b3);
          Mma(s[2 * np], qf[kk], b0, b1);
          Mma(s[2 * np + 1], qf[kk], b2, b3);
        }
      }

      // Causal mask, only where the tile reaches past the warp's first row.
      // Keys at or past kv_end lie past every real row's position too.
      if (n0 + kBlockN - 1 > warp_first_pos) {
#pragma unroll
        for (int j = 0; j < kBlockN / 8; ++j) {
          const int key = n0 + j * 8 + 2 * t;
          if (key > pos0) s[j][0] = -INFINITY;
          if (key + 1 > pos0) s[j][1] = -INFINITY;
          if (key > pos1) s[j][2] = -INFINITY;
          if (key + 1 > pos1) s[j][3] = -INFINITY;
        }
      }

      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
        tile_max[0] = fmaxf(tile_max[0], fmaxf(s[j][0], s[j][1]));
        tile_max[1] = fmaxf(tile_max[1], fmaxf(s[j][2], s[j][3]));
      }
      float alpha[2];
      float shift[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        shift[h] = UpdateRowMax(tile_max[h], scale_log2, row_max[h], alpha[h]);
      }
      float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
        s[j][0] = exp2f(fmaf(s[j][0], scale_log2, -shift[0]));
        s[j][1] = exp2f(fmaf(s[j][1], scale_log2, -shift[0]));
        s[j][2] = exp2f(fmaf(s[j][2], scale_log2, -shift[1]));
        s[j][3] = exp2f(fmaf(s[j][3], scale_log2, -shift[1]));
        tile_sum[0] += s[j][0] + s[j][1];
        tile_sum[1] += s[j][2] + s[j][3];
      }
      row_sum[0] = row_sum[0] * alpha[0] + tile_sum[0];
      row_sum[1] = row_sum[1] * alpha[1] + tile_sum[1];
#pragma unroll
      for (int d = 0; d < kHeadDim / 8; ++d) {
        o[d][0] *= alpha[0];
        o[d][1] *= alpha[0];
        o[d][2] *= alpha[1];
        o[d][3] *= alpha[1];
      }

#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        // P's A fragment for keys 16kk..16kk+15 is S's accumulators of the
        // two 8-key tiles 2kk and 2kk+1.
        const uint32_t a[4] = {PackBf16(s[2 * kk][0], s[2 * kk][1]),
                               PackBf16(s[2 * kk][2], s[2 * kk][3]),
                               PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < kHeadDim / 16; ++dp) {
          if (16 * dp >= hd) break;  // Output dims past head_dim stay 0, unwritten.
          // Transposed matrices: (keys +0..7, dims +0..7), (keys +8..15,
          // dims +0..7), (keys +0..7, dims +8..15), (keys +8..15, dims +8..15).
          const int key = kk * 16 + (lm_mat & 1) * 8 + lm_row;
          const int dim = dp * 16 + (lm_mat >> 1) * 8;
          uint32_t b0, b1, b2, b3;
          LdMatrixX4Trans(SmemAddr(sv + key * Cfg::kRowStride + dim), b0, b1, b2, b3);
          Mma(o[2 * dp], a, b0, b1);
          Mma(o[2 * dp + 1], a, b2, b3);
        }
      }
    }
    // The next iteration refills the buffer this one read.
    __syncthreads();
  }

  if (!warp_has_rows) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
  }
  const float inv0 = row_sum[0] > 0.0f ? 1.0f / row_sum[0] : 0.0f;
  const float inv1 = row_sum[1] > 0.0f ? 1.0f / row_sum[1] : 0.0f;
  __nv_bfloat16* const out = static_cast<__nv_bfloat16*>(p.out);
  const int r0 = warp * 16 + g;
  const int r1 = r0 + 8;
  __nv_bfloat16* const out0 = out + static_cast<int64_t>(query_start + m0 + r0) * p.out_stride +
                              static_cast<int64_t>(head) * hd + 2 * t;
  __nv_bfloat16* const out1 = out0 + 8 * p.out_stride;
#pragma unroll
  for (int d = 0; d < kHeadDim / 8; ++d) {
    if (8 * d >= hd) break;
    if (r0 < rows) {
      *reinterpret_cast<uint32_t*>(out0 + d * 8) = PackBf16(o[d][0] * inv0, o[d][1] * inv0);
    }
    if (r1 < rows) {
      *reinterpret_cast<uint32_t*>(out1 + d * 8) = PackBf16(o[d][2] * inv1, o[d][3] * inv1);
    }
  }
}

template <int kHeadDim, int kBlockM>
cudaError_t Launch(const PagedPrefillParams& params, cudaStream_t stream) {
  using Cfg = TileConfig<kHeadDim, kBlockM>;
  // Exact widths take the instance without the masking.
  const bool exact = params.head_dim == kHeadDim;
  auto* kernel = params.kv_fp8 ? (exact ? &PagedPrefillKernel<kHeadDim, kBlockM, false, true>
                                        : &PagedPrefillKernel<kHeadDim, kBlockM, true, true>)
                               : (exact ? &PagedPrefillKernel<kHeadDim, kBlockM, false, false>
                                        : &PagedPrefillKernel<kHeadDim, kBlockM, true, false>);
  // Above 48 KiB of dynamic shared memory needs the opt-in; it is per device,
  // so it is set on every launch (a cheap host call).
  const cudaError_t error =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
  if (error != cudaSuccess) return error;
  const dim3 grid(params.num_q_heads, (params.max_query_len + kBlockM - 1) / kBlockM, params.batch);
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace

cudaError_t PagedPrefillAttention(const PagedPrefillParams& params, cudaStream_t stream) {
  // 128-row tiles halve the KV traffic per query row; short queries use 64
  // rows to waste fewer padding rows.
  const bool wide = params.max_query_len >= 128;
  // Head dims up to 64 take the 64-wide tiles, up to 128 the 128-wide ones,
  // up to 256 the 256-wide ones (64 rows: 128 would need 202 KiB of shared
  // memory and twice the registers), their dims past head_dim masked.
  if (params.head_dim <= 64) {
    return wide ? Launch<64, 128>(params, stream) : Launch<64, 64>(params, stream);
  }
  if (params.head_dim > 128) return Launch<256, 64>(params, stream);
  return wide ? Launch<128, 128>(params, stream) : Launch<128, 64>(params, stream);
}

}  // namespace trident::kernels::cuda::internal
