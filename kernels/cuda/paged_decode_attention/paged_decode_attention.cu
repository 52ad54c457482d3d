#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/paged_decode_attention/paged_decode_attention_kernel.h"

namespace trident::kernels::cuda::internal {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kVec = 8;             // bf16 elements in one 16-byte load.
constexpr int kStageBytes = 16384;  // K + V of one chunk in shared memory.
constexpr int kStages = 2;          // Chunk c + 1 loads while chunk c is used.

// 16-byte global -> shared copy that bypasses L1; with `valid` false it reads
// nothing and zero-fills the destination.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const unsigned saddr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
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

__device__ __forceinline__ void Unpack(const uint4& raw, float (&f)[kVec]) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {
    const float2 x = __bfloat1622float2(pairs[i]);
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}

// One CTA per (kv head, split, sequence). The split's tokens go through
// shared memory in chunks of kChunk tokens (K then V, [token][head_dim]).
// Thread (tg, dg) = (tid / kTpt, tid % kTpt) owns dims [dg * 8, dg * 8 + 8)
// of tokens tg, tg + kTokPar, ... of every chunk: it loads them, computes
// their partial q.k for every q head (reduced over the kTpt lanes of the
// token by shuffles), and accumulates p * v for them. Per chunk: scores ->
// online softmax per q head (one warp per head) -> rescale and accumulate.
// At the end the kTokPar partial accumulators are summed through shared
// memory. kMaxGroup >= the GQA group; heads past it are computed with q = 0
// and never written.
template <int kHeadDim, int kMaxGroup>
__global__ void __launch_bounds__(kThreads) DecodeSplitKernel(const DecodeKernelParams p) {
  constexpr int kTpt = kHeadDim / kVec;                 // Lanes per token: 16 or 8.
  constexpr int kTokPar = kThreads / kTpt;              // Tokens side by side: 8 or 16.
  constexpr int kChunk = kStageBytes / (4 * kHeadDim);  // Tokens per chunk: 32 or 64.
  constexpr int kIters = kChunk / kTokPar;              // Tokens per thread per chunk.
  constexpr int kStageElems = kChunk * kHeadDim;        // bf16 of K (or V) in a stage.
  static_assert(kIters * kTokPar == kChunk, "chunk must tile the threads");
  static_assert(kChunk % 32 == 0, "softmax gives each lane whole tokens");
  static_assert(kTokPar * kMaxGroup * kHeadDim * 4 <= kStages * kStageBytes,
                "the final reduction reuses the stages");

  __shared__ uint4 smem_stages[kStages * kStageBytes / 16];
  __shared__ float scores[kMaxGroup][kChunk];
  __shared__ float run_max[kMaxGroup];
  __shared__ float run_sum[kMaxGroup];
  __shared__ float rescale[kMaxGroup];

  const int kv_head = blockIdx.x;
  const int split = blockIdx.y;
  const int seq = blockIdx.z;
  const int tid = threadIdx.x;
  const int tg = tid / kTpt;
  const int dg = tid % kTpt;
  const int group = p.group;

  // This split's tokens [begin, end) of the sequence.
  const int64_t table_cap = static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size;
  int64_t ctx = p.context_lens[seq];
  ctx = ctx < 0 ? 0 : (ctx > table_cap ? table_cap : ctx);
  int64_t per_split = (ctx + p.num_splits - 1) / p.num_splits;
  per_split = (per_split + kChunk - 1) / kChunk * kChunk;
  const int64_t split_begin = split * per_split;
  const int64_t begin = split_begin < ctx ? split_begin : ctx;
  const int64_t end = begin + per_split < ctx ? begin + per_split : ctx;
  const int num_chunks = static_cast<int>((end - begin + kChunk - 1) / kChunk);

  // q of this thread's dims for each head of the group, pre-scaled.
  const __nv_bfloat16* q_row = static_cast<const __nv_bfloat16*>(p.q) +
                               static_cast<int64_t>(seq) * p.q_stride +
                               static_cast<int64_t>(kv_head) * group * kHeadDim + dg * kVec;
  float q[kMaxGroup][kVec];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      q[g][k] = g < group ? __bfloat162float(q_row[g * kHeadDim + k]) * p.scale_log2 : 0.0f;
    }
  }
  float acc[kMaxGroup][kVec];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) acc[g][k] = 0.0f;
  }
  if (tid < kMaxGroup) {
    run_max[tid] = -INFINITY;
    run_sum[tid] = 0.0f;
  }

  __nv_bfloat16* stage_base = reinterpret_cast<__nv_bfloat16*>(smem_stages);
  const __nv_bfloat16* kv = static_cast<const __nv_bfloat16*>(p.kv);
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  auto load_chunk = [&](int chunk, int stage) {
    __nv_bfloat16* k_dst = stage_base + stage * 2 * kStageElems;
    __nv_bfloat16* v_dst = k_dst + kStageElems;
    const int64_t chunk_begin = begin + static_cast<int64_t>(chunk) * kChunk;
#pragma unroll
    for (int j = 0; j < kIters; ++j) {
      const int t = tg + j * kTokPar;
      const int64_t pos = chunk_begin + t;
      const bool valid = pos < end;
      const __nv_bfloat16* src = kv;  // Not read when invalid.
      if (valid) {
        const int64_t block = table[pos / p.block_size];
        const int64_t slot = pos % p.block_size;
        src = kv + block * p.block_stride + (kv_head * p.block_size + slot) * kHeadDim + dg * kVec;
      }
      CpAsync16(k_dst + t * kHeadDim + dg * kVec, src, valid);
      CpAsync16(v_dst + t * kHeadDim + dg * kVec, valid ? src + p.value_offset : src, valid);
    }
  };

  if (num_chunks > 0) load_chunk(0, 0);
  CpAsyncCommit();
  for (int c = 0; c < num_chunks; ++c) {
    const int stage = c % kStages;
    // The other stage held chunk c - 1, finished before the last barrier.
    if (c + 1 < num_chunks) load_chunk(c + 1, (c + 1) % kStages);
    CpAsyncCommit();
    CpAsyncWait<1>();  // Chunk c has landed.
    __syncthreads();

    const __nv_bfloat16* k_s = stage_base + stage * 2 * kStageElems;
    const __nv_bfloat16* v_s = k_s + kStageElems;
    const int64_t chunk_begin = begin + static_cast<int64_t>(c) * kChunk;

    // Scores, base 2.
#pragma unroll
    for (int j = 0; j < kIters; ++j) {
      const int t = tg + j * kTokPar;
      float kf[kVec];
      Unpack(*reinterpret_cast<const uint4*>(k_s + t * kHeadDim + dg * kVec), kf);
      float dot[kMaxGroup];
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < kVec; ++k) s = fmaf(q[g][k], kf[k], s);
        dot[g] = s;
      }
#pragma unroll
      for (int offset = kTpt / 2; offset > 0; offset /= 2) {
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], offset);
      }
      if (dg == 0) {
        const bool valid = chunk_begin + t < end;
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) scores[g][t] = valid ? dot[g] : -INFINITY;
      }
    }
    __syncthreads();

    // Online softmax: warp w updates heads w, w + kWarps, ...; scores become
    // probabilities relative to the new running max.
    const int warp = tid / 32;
    const int lane = tid % 32;
    for (int g = warp; g < kMaxGroup; g += kWarps) {
      float s[kChunk / 32];
      float chunk_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < kChunk / 32; ++i) {
        s[i] = scores[g][lane + 32 * i];
        chunk_max = fmaxf(chunk_max, s[i]);
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, offset));
      }
      const float old_max = run_max[g];
      const float new_max = fmaxf(old_max, chunk_max);  // Finite: a chunk has a valid token.
      float sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kChunk / 32; ++i) {
        const float e = exp2f(s[i] - new_max);
        scores[g][lane + 32 * i] = e;
        sum += e;
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        sum += __shfl_xor_sync(0xffffffffu, sum, offset);
      }
      __syncwarp();
      if (lane == 0) {
        const float alpha = exp2f(old_max - new_max);  // 0 on the first chunk.
        rescale[g] = alpha;
        run_sum[g] = run_sum[g] * alpha + sum;
        run_max[g] = new_max;
      }
    }
    __syncthreads();

    // acc = acc * alpha + p . V
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      const float alpha = rescale[g];
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[g][k] *= alpha;
    }
#pragma unroll
    for (int j = 0; j < kIters; ++j) {
      const int t = tg + j * kTokPar;
      float vf[kVec];
      Unpack(*reinterpret_cast<const uint4*>(v_s + t * kHeadDim + dg * kVec), vf);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        const float pg = scores[g][t];
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[g][k] = fmaf(pg, vf[k], acc[g][k]);
      }
    }
    __syncthreads();  // scores, rescale and this stage are rewritten next.
  }
  CpAsyncWait<0>();
  __syncthreads();

  // Sum the kTokPar partial accumulators: red[tg][g][dim].
  float* red = reinterpret_cast<float*>(smem_stages);
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    float4* dst = reinterpret_cast<float4*>(red + (tg * kMaxGroup + g) * kHeadDim + dg * kVec);
    dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
    dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
  }
  __syncthreads();
  for (int i = tid; i < group * kHeadDim; i += kThreads) {
    float total = 0.0f;
#pragma unroll
    for (int l = 0; l < kTokPar; ++l) total += red[l * kMaxGroup * kHeadDim + i];
    const int g = i / kHeadDim;
    const int d = i % kHeadDim;
    const int h = kv_head * group + g;
    const float denom = run_sum[g];
    const float value = denom > 0.0f ? total / denom : 0.0f;
    if (p.partial_out == nullptr) {
      static_cast<__nv_bfloat16*>(p.out)[static_cast<int64_t>(seq) * p.out_stride +
                                         static_cast<int64_t>(h) * kHeadDim + d] =
          __float2bfloat16_rn(value);
    } else {
      const int64_t row = (static_cast<int64_t>(seq) * p.num_q_heads + h) * p.num_splits + split;
      p.partial_out[row * kHeadDim + d] = value;
      if (d == 0) {
        p.partial_stats[2 * row] = run_max[g];
        p.partial_stats[2 * row + 1] = denom;
      }
    }
  }
}

// One CTA per (q head, sequence), one thread per dim: out = sum_s w_s o_s /
// sum_s w_s with w_s = 2^(m_s - M) l_s.
__global__ void DecodeMergeKernel(const DecodeKernelParams p) {
  const int h = blockIdx.x;
  const int seq = blockIdx.y;
  const int d = threadIdx.x;
  const int64_t first = (static_cast<int64_t>(seq) * p.num_q_heads + h) * p.num_splits;
  float global_max = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) {
    global_max = fmaxf(global_max, p.partial_stats[2 * (first + s)]);
  }
  float num = 0.0f;
  float den = 0.0f;
  if (global_max != -INFINITY) {
    for (int s = 0; s < p.num_splits; ++s) {
      const float l = p.partial_stats[2 * (first + s) + 1];
      if (l > 0.0f) {
        const float w = exp2f(p.partial_stats[2 * (first + s)] - global_max) * l;
        num = fmaf(w, p.partial_out[(first + s) * p.head_dim + d], num);
        den += w;
      }
    }
  }
  static_cast<__nv_bfloat16*>(
      p.out)[static_cast<int64_t>(seq) * p.out_stride + static_cast<int64_t>(h) * p.head_dim + d] =
      __float2bfloat16_rn(den > 0.0f ? num / den : 0.0f);
}

template <int kHeadDim>
cudaError_t LaunchSplit(const DecodeKernelParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(p.num_splits),
                  static_cast<unsigned>(p.batch));
  if (p.group <= 1) {
    DecodeSplitKernel<kHeadDim, 1><<<grid, kThreads, 0, stream>>>(p);
  } else if (p.group <= 2) {
    DecodeSplitKernel<kHeadDim, 2><<<grid, kThreads, 0, stream>>>(p);
  } else if (p.group <= 4) {
    DecodeSplitKernel<kHeadDim, 4><<<grid, kThreads, 0, stream>>>(p);
  } else {
    DecodeSplitKernel<kHeadDim, 8><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t PagedDecodeBf16(const DecodeKernelParams& params, cudaStream_t stream) {
  if (params.batch == 0) return cudaSuccess;
  const cudaError_t error =
      params.head_dim == 64 ? LaunchSplit<64>(params, stream) : LaunchSplit<128>(params, stream);
  if (error != cudaSuccess || params.partial_out == nullptr) return error;
  DecodeMergeKernel<<<dim3(static_cast<unsigned>(params.num_q_heads),
                           static_cast<unsigned>(params.batch)),
                      static_cast<unsigned>(params.head_dim), 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace trident::kernels::cuda::internal
