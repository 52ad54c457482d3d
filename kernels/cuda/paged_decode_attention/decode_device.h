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
template <int kChunk>
__device__ __forceinline__ void SplitRange(const DecodeKernelParams& p, int seq, int split,
                                           int64_t* begin, int64_t* end) {
  const int64_t table_cap = static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size;
  int64_t ctx = p.context_lens[seq];
  ctx = ctx < 0 ? 0 : (ctx > table_cap ? table_cap : ctx);
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
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row = lane / 4;
  const int quad = lane % 4;
  float* red_o = reinterpret_cast<float*>(smem);
  float* red_m = red_o + kNumWarps * 8 * kHeadDim;
  float* red_l = red_m + kNumWarps * 8;
#pragma unroll
  for (int nt = 0; nt < kHeadDim / 8; ++nt) {
    *reinterpret_cast<float2*>(red_o + (warp * 8 + row) * kHeadDim + 8 * nt + 2 * quad) =
        make_float2(acc[nt][0], acc[nt][1]);
  }
  if (quad == 0) {
    red_m[warp * 8 + row] = run_max;
    red_l[warp * 8 + row] = run_sum;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < p.group * kHeadDim; i += kNumWarps * 32) {
    const int g = i / kHeadDim;
    const int d = i % kHeadDim;
    if (d >= hd) continue;
    float max = -INFINITY;
#pragma unroll
    for (int w = 0; w < kNumWarps; ++w) max = fmaxf(max, red_m[w * 8 + g]);
    float denom = 0.0f;
    float total = 0.0f;
    if (max != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kNumWarps; ++w) {
        const float weight = exp2f(red_m[w * 8 + g] - max);  // 0 for a warp without tokens.
        denom = fmaf(weight, red_l[w * 8 + g], denom);
        total = fmaf(weight, red_o[(w * 8 + g) * kHeadDim + d], total);
      }
    }
    const float value = denom > 0.0f ? total / denom : 0.0f;
    StoreSplitResult(p, seq, split, kv_head * p.group + g, hd, d, value, max, denom);
  }
}

}  // namespace trident::kernels::cuda::internal

#endif  // __CUDACC__

#endif  // TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_DECODE_DEVICE_H_
