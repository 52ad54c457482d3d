#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/cuda/paged_decode_attention/decode_device.h"
#include "kernels/cuda/paged_decode_attention/paged_decode_attention_kernel.h"
#include "kernels/cuda/pdl/pdl_device.h"

namespace trident::kernels::cuda::internal {
namespace {

// ---------------------------------------------------------------------------
// Legacy kernel (variant 0).

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
template <int kHeadDim, bool kMasked, int kMaxGroup>
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
  // The merge, or the output projection, after it may start early (each
  // waits for this grid to end before it reads its output); launched with
  // programmatic dependent launch itself, this kernel waits for the one
  // ahead (the KV append) before its first load.
  pdl::LetDependentsLaunchThenWait();
  __shared__ float rescale[kMaxGroup];

  const int kv_head = blockIdx.x;
  const int split = blockIdx.y;
  const int seq = blockIdx.z;
  const int tid = threadIdx.x;
  const int tg = tid / kTpt;
  const int dg = tid % kTpt;
  const int group = p.group;
  // The model's head_dim (a multiple of 16, <= kHeadDim): the lanes of dims
  // past it load zeros (q, K and V), add nothing and write nothing.
  const int hd = kMasked ? p.head_dim : kHeadDim;
  const bool dims_live = dg * kVec < hd;

  // This split's tokens [begin, end) of the sequence.
  int64_t begin = 0;
  int64_t end = 0;
  SplitRange<kChunk>(p, seq, split, &begin, &end);
  const int num_chunks = static_cast<int>((end - begin + kChunk - 1) / kChunk);

  // q of this thread's dims for each head of the group, pre-scaled.
  const __nv_bfloat16* q_row = static_cast<const __nv_bfloat16*>(p.q) +
                               static_cast<int64_t>(seq) * p.q_stride +
                               static_cast<int64_t>(kv_head) * group * hd + dg * kVec;
  float q[kMaxGroup][kVec];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      q[g][k] = g < group && dims_live ? __bfloat162float(q_row[g * hd + k]) * p.scale_log2 : 0.0f;
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
      const bool valid = pos < end && dims_live;
      const __nv_bfloat16* src = kv;  // Not read when invalid.
      if (valid) {
        const int64_t block = table[pos / p.block_size];
        const int64_t slot = pos % p.block_size;
        src = kv + block * p.block_stride + (kv_head * p.block_size + slot) * hd + dg * kVec;
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
    if (d >= hd) continue;
    const int h = kv_head * group + g;
    const float denom = run_sum[g];
    const float value = denom > 0.0f ? total / denom : 0.0f;
    if (p.partial_out == nullptr) {
      static_cast<__nv_bfloat16*>(
          p.out)[static_cast<int64_t>(seq) * p.out_stride + static_cast<int64_t>(h) * hd + d] =
          __float2bfloat16_rn(value);
    } else {
      const int64_t row = (static_cast<int64_t>(seq) * p.num_q_heads + h) * p.num_splits + split;
      p.partial_out[row * hd + d] = value;
      if (d == 0) {
        p.partial_stats[2 * row] = run_max[g];
        p.partial_stats[2 * row + 1] = denom;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Tensor-core kernel (variants with kind kMma).
//
// One CTA per (kv head, split, sequence) of kNumWarps warps. The split's
// tokens are cut into 16-token chunks; warp w takes chunks w, w + kNumWarps,
// ... and runs its own kNumStages-deep cp.async pipeline over them in its own
// shared memory (no CTA barrier until the end), so the SM keeps about
// warps x stages x 8 KiB (head_dim 128) of K and V loads in flight.
//
// Per chunk, with the q heads of the GQA group as the rows of the MMA (rows
// group..15 are zero; rows 8..15 are never formed: their A registers are zero
// and their accumulators are discarded):
//   S[head][token] = Q . K^T   mma m16n8k16, A = q (registers, loaded once),
//                              B = K via ldmatrix (token rows);
//   online softmax in base 2 on S (lane quad = one head row);
//   O[head][dim] += P . V      A = P from S's accumulators (bf16), B = V via
//                              ldmatrix.trans.
// Lane l holds head l / 4, tokens (or dims) 2 * (l % 4) + {0, 1} of each
// 8-wide MMA tile. Shared memory tiles are [token][head_dim] with the 16-byte
// piece p of row r stored at p ^ (r % 8), so every ldmatrix phase (8 rows,
// same piece) hits 8 different bank groups.
//
// The warps' (max, sum, O) are merged through shared memory at the end and
// written as the output (one split) or as a normalized partial with its
// (max, sum) for the merge kernel. A warp or CTA without tokens writes
// (max, sum) = (-inf, 0), which the merges ignore.

__device__ __forceinline__ void LdMatrixX4(uint32_t saddr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(saddr));
}

__device__ __forceinline__ void LdMatrixX4Trans(uint32_t saddr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(saddr));
}

// d[row l/4][2(l%4) + {0,1}] += A . B for an m16n8k16 bf16 MMA whose A rows
// 8..15 are zero: a0 holds A[l/4][k 2(l%4) + {0,1}], a2 the same at k + 8;
// b0 / b1 hold B[k 2(l%4) + {0,1}][n l/4] and k + 8. Rows 8..15 of the result
// are discarded.
__device__ __forceinline__ void MmaTopRows(float& d0, float& d1, uint32_t a0, uint32_t a2,
                                           uint32_t b0, uint32_t b1) {
  [[maybe_unused]] float unused0;
  [[maybe_unused]] float unused1;
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %10, %11};\n"
      : "+f"(d0), "+f"(d1), "=f"(unused0), "=f"(unused1)
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1), "f"(0.0f), "f"(0.0f));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// kCluster: the grid is (split, kv head, sequence), each sequence's and kv
// head's splits one cluster, merged through distributed shared memory
// (MergeClusterAndWrite).
template <int kHeadDim, bool kMasked, int kNumWarps, int kNumStages, bool kOneBlock, bool kCluster>
__global__ void __launch_bounds__(kNumWarps * 32, MmaCtasPerSm(kNumWarps, kNumStages, kHeadDim))
    DecodeMmaKernel(const DecodeKernelParams p) {
  constexpr int kChunk = kMmaChunkTokens;
  constexpr int kRowBytes = kHeadDim * 2;
  constexpr int kRowPieces = kHeadDim / 8;       // 16-byte pieces per token row: 16 or 8.
  constexpr int kRowsPerCopy = 32 / kRowPieces;  // Rows one warp-wide copy covers: 2 or 4.
  constexpr int kCopies = kChunk / kRowsPerCopy;
  constexpr int kTileBytes = kChunk * kRowBytes;  // K (or V) of one chunk.
  constexpr int kStageBytes = 2 * kTileBytes;
  constexpr int kKSteps = kHeadDim / 16;
  constexpr int kDimTiles = kHeadDim / 8;
  static_assert(kChunk == 16, "one chunk is one k step of the PV mma");
  static_assert(kRowsPerCopy * kRowPieces == 32 && kCopies * kRowsPerCopy == kChunk,
                "a chunk's copies tile the warp");
  static_assert(kNumWarps * (8 * kHeadDim + 16) * 4 <= kNumWarps * kNumStages * kStageBytes,
                "the final merge reuses the stages");

  extern __shared__ __align__(128) unsigned char smem[];

  // A merge kernel launched with programmatic dependent launch may start its
  // CTAs now; they wait for this whole grid before reading anything. As
  // the legacy kernel, this one waits for the kernel ahead before its first
  // load, or (stable_prefix) after its pipeline's first copies.
  pdl::LetDependentsLaunch();
  if (!p.stable_prefix) pdl::WaitForPreviousGrid();

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int kv_head = kCluster ? blockIdx.y : blockIdx.x;
  const int split = kCluster ? blockIdx.x : blockIdx.y;
  const int seq = blockIdx.z;
  const int row = lane / 4;   // Head within the group this lane's accumulators hold.
  const int quad = lane % 4;  // Tokens / dims 2 * quad + {0, 1} of each 8-wide tile.

  // This split's tokens [begin, end); per_split is a multiple of kChunk, so
  // every chunk starts at a multiple of kChunk of the sequence.
  int64_t begin = 0;
  int64_t end = 0;
  int64_t context = 0;
  SplitRange<kChunk>(p, seq, split, &begin, &end, &context);
  const int num_chunks = static_cast<int>((end - begin + kChunk - 1) / kChunk);
  const int my_chunks = warp < num_chunks ? (num_chunks - warp + kNumWarps - 1) / kNumWarps : 0;
  const int hd = kMasked ? p.head_dim : kHeadDim;
  const __nv_bfloat16* kv = static_cast<const __nv_bfloat16*>(p.kv);
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int block_size = p.block_size;
  const uint32_t warp_smem = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) +
                             static_cast<uint32_t>(warp * kNumStages * kStageBytes);

  auto chunk_start = [&](int i) -> int64_t {
    return begin + static_cast<int64_t>(warp + i * kNumWarps) * kChunk;
  };
  auto valid_tokens = [&](int64_t start) -> int {
    return static_cast<int>(end - start < kChunk ? end - start : kChunk);
  };
  // The table entry this lane needs for the warp's chunk i (0 past the end).
  // kOneBlock (block_size a multiple of 16): a chunk lies inside one block,
  // so one table entry per chunk and contiguous rows. Otherwise lane t < 16
  // looks up token t's block and the other lanes get its row by shuffle.
  const int lane_token = kOneBlock ? 0 : lane % kChunk;
  auto fetch_block = [&](int i) -> int32_t {
    if (i >= my_chunks) return 0;
    const int64_t t = chunk_start(i) + lane_token;
    if (t >= end) return 0;
    const int index =
        block_size == kChunk ? static_cast<int>(t) / kChunk : static_cast<int>(t) / block_size;
    return __ldg(table + index);
  };
  // Starts the copies of the warp's chunk i into `stage`; `block` from
  // fetch_block(i). Rows past the context are zero-filled without reading.
  auto issue_chunk = [&](int i, int32_t block, int stage) {
    const int64_t start = chunk_start(i);
    const int valid = valid_tokens(start);
    const uint32_t k_dst = warp_smem + static_cast<uint32_t>(stage * kStageBytes);
    const uint32_t v_dst = k_dst + kTileBytes;
    const int piece = lane % kRowPieces;
    const bool piece_live = piece * 8 < hd;
    if constexpr (kOneBlock) {
      // Every row of the chunk is inside `block` (a real block), so the
      // source address is valid even for rows past the context.
      const int slot = block_size == kChunk ? 0 : static_cast<int>(start) % block_size;
      const __nv_bfloat16* k_src =
          kv + static_cast<int64_t>(block) * p.block_stride +
          (static_cast<int64_t>(kv_head) * block_size + slot + lane / kRowPieces) * hd + piece * 8;
      const __nv_bfloat16* v_src = k_src + p.value_offset;
#pragma unroll
      for (int j = 0; j < kCopies; ++j) {
        const int r = j * kRowsPerCopy + lane / kRowPieces;
        const uint32_t dst = static_cast<uint32_t>(r * kRowBytes + ((piece ^ (r & 7)) * 16));
        const bool ok = r < valid && piece_live;
        CpAsync16Shared(k_dst + dst, k_src + j * kRowsPerCopy * hd, ok);
        CpAsync16Shared(v_dst + dst, v_src + j * kRowsPerCopy * hd, ok);
      }
    } else {
      const int64_t last = end - 1;
      const int token = static_cast<int>(start + lane_token < last ? start + lane_token : last);
      const int64_t lane_row =
          static_cast<int64_t>(block) * p.block_stride +
          (static_cast<int64_t>(kv_head) * block_size + token % block_size) * hd;
#pragma unroll
      for (int j = 0; j < kCopies; ++j) {
        const int r = j * kRowsPerCopy + lane / kRowPieces;
        const int64_t row_at = __shfl_sync(~0u, lane_row, r);
        const bool ok = r < valid && piece_live;
        const __nv_bfloat16* src = kv + row_at + piece * 8;
        const uint32_t dst = static_cast<uint32_t>(r * kRowBytes + ((piece ^ (r & 7)) * 16));
        CpAsync16Shared(k_dst + dst, ok ? src : kv, ok);
        CpAsync16Shared(v_dst + dst, ok ? src + p.value_offset : kv, ok);
      }
    }
  };

  // Prologue: chunks 0 .. kNumStages - 2, their table entries fetched together.
  int32_t first_blocks[kNumStages - 1];
#pragma unroll
  for (int s = 0; s < kNumStages - 1; ++s) first_blocks[s] = fetch_block(s);
  int32_t next_block = fetch_block(kNumStages - 1);
#pragma unroll
  for (int s = 0; s < kNumStages - 1; ++s) {
    if (s < my_chunks) issue_chunk(s, first_blocks[s], s);
    CpAsyncCommit();
  }
  // With stable_prefix the prologue's copies ran before the kernel ahead
  // ended. The newest position (this step's token, which that kernel may
  // write) is read again now, and written over its row once its chunk has
  // landed (NewestRow).
  NewestRow<kHeadDim> newest;
  if (p.stable_prefix) {
    pdl::WaitForPreviousGrid();
    newest.template Load<kNumWarps, kNumStages - 1>(p, kv, table, kv_head, hd, begin, end, context,
                                                    warp, lane);
  }

  // q as MMA A fragments (bf16 as stored; the scale is applied to the fp32
  // scores): qa[ks][0] = q[row][16 ks + 2 quad + {0,1}], qa[ks][1] at + 8.
  // The model's head_dim (a multiple of 16, <= kHeadDim): dims past it are
  // zeros in q and in the K and V tiles, and their k steps and output tiles
  // are skipped.
  uint32_t qa[kKSteps][2];
  LoadQFragments<kKSteps>(
      p, seq, kv_head, row, quad, hd,
      [](__nv_bfloat162 pair) { return *reinterpret_cast<const uint32_t*>(&pair); }, qa);

  float acc[kDimTiles][2];
#pragma unroll
  for (int nt = 0; nt < kDimTiles; ++nt) acc[nt][0] = acc[nt][1] = 0.0f;
  float run_max = -INFINITY;
  float run_sum = 0.0f;  // This lane's tokens only; summed over the quad at the end.

  for (int i = 0; i < my_chunks; ++i) {
    // Refill the stage chunk i - 1 used (all lanes passed the __syncwarp
    // after reading it), prefetching the table entry one chunk further.
    const int ahead = i + kNumStages - 1;
    if (ahead < my_chunks) {
      const int32_t block = next_block;
      next_block = fetch_block(ahead + 1);
      issue_chunk(ahead, block, ahead % kNumStages);
    }
    CpAsyncCommit();
    CpAsyncWait<kNumStages - 1>();  // This lane's copies of chunk i landed.
    __syncwarp();                   // ... and every lane's.

    const int stage = i % kNumStages;
    if (i == newest.chunk) {
      newest.Store(smem + warp * kNumStages * kStageBytes + stage * kStageBytes, kTileBytes, lane);
      __syncwarp();
    }
    const uint32_t k_src = warp_smem + static_cast<uint32_t>(stage * kStageBytes);
    const uint32_t v_src = k_src + kTileBytes;
    const int valid = valid_tokens(chunk_start(i));

    // S = Q . K^T for tokens 0..7 (s[0]) and 8..15 (s[1]).
    float s[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
    for (int kp = 0; kp < kKSteps / 2; ++kp) {
      if (32 * kp >= hd) break;  // Zero dims past head_dim.
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        // Matrix m = lane / 8: tokens 8 j .. 8 j + 7, piece 4 kp + m.
        const int r = 8 * j + (lane & 7);
        const int piece = 4 * kp + (lane >> 3);
        uint32_t b[4];
        LdMatrixX4(k_src + static_cast<uint32_t>(r * kRowBytes + ((piece ^ (r & 7)) * 16)), b);
        MmaTopRows(s[j][0], s[j][1], qa[2 * kp][0], qa[2 * kp][1], b[0], b[1]);
        MmaTopRows(s[j][0], s[j][1], qa[2 * kp + 1][0], qa[2 * kp + 1][1], b[2], b[3]);
      }
    }

    // Online softmax of head `row` over the chunk's valid tokens.
    float chunk_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 8 * j + 2 * quad + e;
        s[j][e] = t < valid ? s[j][e] * p.scale_log2 : -INFINITY;
        chunk_max = fmaxf(chunk_max, s[j][e]);
      }
    }
    chunk_max = fmaxf(chunk_max, __shfl_xor_sync(~0u, chunk_max, 1));
    chunk_max = fmaxf(chunk_max, __shfl_xor_sync(~0u, chunk_max, 2));
    const float new_max = fmaxf(run_max, chunk_max);  // Finite: a chunk has a valid token.
    const float alpha = exp2f(run_max - new_max);     // 0 on the first chunk.
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[j][e] = exp2f(s[j][e] - new_max);
        sum += s[j][e];
      }
    }
    run_sum = run_sum * alpha + sum;
    run_max = new_max;
    // P as the A fragment: k = tokens 2 quad + {0,1} (s[0]) and + 8 (s[1]).
    const uint32_t pa0 = PackBf16(s[0][0], s[0][1]);
    const uint32_t pa2 = PackBf16(s[1][0], s[1][1]);

    // O = O * alpha + P . V, two 8-dim tiles per ldmatrix.
#pragma unroll
    for (int nt = 0; nt < kDimTiles; ++nt) {
      acc[nt][0] *= alpha;
      acc[nt][1] *= alpha;
    }
#pragma unroll
    for (int pp = 0; pp < kDimTiles / 2; ++pp) {
      if (16 * pp >= hd) break;  // Output dims past head_dim stay 0, unwritten.
      // Matrix m = lane / 8: tokens 8 (m % 2) .. + 7, piece 2 pp + m / 2.
      const int r = (lane & 7) + ((lane >> 3) & 1) * 8;
      const int piece = 2 * pp + (lane >> 4);
      uint32_t b[4];
      LdMatrixX4Trans(v_src + static_cast<uint32_t>(r * kRowBytes + ((piece ^ (r & 7)) * 16)), b);
      MmaTopRows(acc[2 * pp][0], acc[2 * pp][1], pa0, pa2, b[0], b[1]);
      MmaTopRows(acc[2 * pp + 1][0], acc[2 * pp + 1][1], pa0, pa2, b[2], b[3]);
    }
    __syncwarp();  // Every lane read this stage before it is refilled.
  }
  CpAsyncWait<0>();
  run_sum += __shfl_xor_sync(~0u, run_sum, 1);
  run_sum += __shfl_xor_sync(~0u, run_sum, 2);
  __syncthreads();  // All warps are done with their stages.

  if constexpr (kCluster) {
    MergeClusterAndWrite<kHeadDim, kNumWarps>(p, smem, acc, run_max, run_sum, hd, kv_head, split,
                                              seq);
  } else {
    MergeWarpsAndWrite<kHeadDim, kNumWarps>(p, smem, acc, run_max, run_sum, hd, kv_head, split,
                                            seq);
  }
}

// One CTA per (q head, sequence), one thread per dim: out = sum_s w_s o_s /
// sum_s w_s with w_s = 2^(m_s - M) l_s.
__global__ void DecodeMergeKernel(const DecodeKernelParams p) {
  const int h = blockIdx.x;
  const int seq = blockIdx.y;
  const int d = threadIdx.x;
  // The output projection after it may start loading its weights; launched
  // with programmatic dependent launch, this kernel waits for the split
  // kernel (a no-op otherwise).
  pdl::LetDependentsLaunchThenWait();
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

template <int kHeadDim, bool kMasked>
cudaError_t LaunchLegacy(const DecodeKernelParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(p.num_splits),
                  static_cast<unsigned>(p.batch));
  void (*kernel)(DecodeKernelParams) = p.group <= 1   ? DecodeSplitKernel<kHeadDim, kMasked, 1>
                                       : p.group <= 2 ? DecodeSplitKernel<kHeadDim, kMasked, 2>
                                       : p.group <= 4 ? DecodeSplitKernel<kHeadDim, kMasked, 4>
                                                      : DecodeSplitKernel<kHeadDim, kMasked, 8>;
  return pdl::Launch(kernel, grid, dim3(kThreads), 0, stream, p.pdl, p);
}

template <int kHeadDim, bool kMasked, int kNumWarps, int kNumStages, bool kOneBlock, bool kCluster>
cudaError_t LaunchMmaKernel(const DecodeKernelParams& p, cudaStream_t stream) {
  constexpr int64_t kSmemBytes = MmaSharedBytes(kNumWarps, kNumStages, kHeadDim);
  static_assert(kSmemBytes == int64_t{kNumWarps} * kNumStages * 2 * kMmaChunkTokens * kHeadDim * 2,
                "the kernel's stages fill the shared memory");
  static_assert(kSmemBytes <= kMaxSharedBytesPerCta, "fits one SM's shared memory");
  static_assert(kMergeWarpsBytes<kHeadDim, kNumWarps> + (8 * kHeadDim + 16) * 4 <= kSmemBytes,
                "the cluster merge reuses the stages");
  void (*kernel)(DecodeKernelParams) =
      DecodeMmaKernel<kHeadDim, kMasked, kNumWarps, kNumStages, kOneBlock, kCluster>;
  static std::atomic<uint64_t> configured{0};
  const cudaError_t error = ConfigureSharedMemoryOnce(kernel, kSmemBytes, configured);
  if (error != cudaSuccess) return error;
  const unsigned heads = static_cast<unsigned>(p.num_kv_heads);
  const unsigned splits = static_cast<unsigned>(p.num_splits);
  const dim3 grid = kCluster ? dim3(splits, heads, static_cast<unsigned>(p.batch))
                             : dim3(heads, splits, static_cast<unsigned>(p.batch));
  return pdl::LaunchClustered(kernel, grid, dim3(kNumWarps * 32), static_cast<size_t>(kSmemBytes),
                              stream, p.pdl, kCluster ? splits : 1u, p);
}

template <int kHeadDim, bool kMasked, int kNumWarps, int kNumStages, bool kCluster>
cudaError_t LaunchMma(const DecodeKernelParams& p, cudaStream_t stream) {
  return p.block_size % kMmaChunkTokens == 0
             ? LaunchMmaKernel<kHeadDim, kMasked, kNumWarps, kNumStages, true, kCluster>(p, stream)
             : LaunchMmaKernel<kHeadDim, kMasked, kNumWarps, kNumStages, false, kCluster>(p,
                                                                                          stream);
}

// Whether params' splits merge in clusters (a kMmaCluster variant with 2 to
// kMaxClusterSplits splits over the bf16 cache), so no merge kernel runs.
bool MergesInClusters(const DecodeKernelParams& p) {
  return !p.fp8 && kDecodeVariants[p.variant].kind == DecodeKernelKind::kMmaCluster &&
         p.num_splits >= 2 && p.num_splits <= kMaxClusterSplits;
}

template <int kHeadDim, bool kMasked, int kVariant>
cudaError_t LaunchVariant(const DecodeKernelParams& p, cudaStream_t stream) {
  constexpr DecodeVariantSpec kSpec = kDecodeVariants[kVariant];
  if constexpr (!VariantRunsAt(kSpec, kHeadDim)) {
    // Never instantiated for launch: PagedDecodeBf16 runs EffectiveVariant.
    return cudaErrorInvalidValue;
  } else if constexpr (kSpec.kind == DecodeKernelKind::kLegacy) {
    return LaunchLegacy<kHeadDim, kMasked>(p, stream);
  } else if constexpr (kSpec.kind == DecodeKernelKind::kMmaCluster) {
    return MergesInClusters(p)
               ? LaunchMma<kHeadDim, kMasked, kSpec.warps, kSpec.stages, true>(p, stream)
               : LaunchMma<kHeadDim, kMasked, kSpec.warps, kSpec.stages, false>(p, stream);
  } else {
    return LaunchMma<kHeadDim, kMasked, kSpec.warps, kSpec.stages, false>(p, stream);
  }
}

template <int kHeadDim, bool kMasked>
cudaError_t LaunchSplit(const DecodeKernelParams& p, cudaStream_t stream) {
  static_assert(kNumDecodeKernelVariants == 12, "one case per variant below");
  switch (p.variant) {
    case 0:
      return LaunchVariant<kHeadDim, kMasked, 0>(p, stream);
    case 1:
      return LaunchVariant<kHeadDim, kMasked, 1>(p, stream);
    case 2:
      return LaunchVariant<kHeadDim, kMasked, 2>(p, stream);
    case 3:
      return LaunchVariant<kHeadDim, kMasked, 3>(p, stream);
    case 4:
      return LaunchVariant<kHeadDim, kMasked, 4>(p, stream);
    case 5:
      return LaunchVariant<kHeadDim, kMasked, 5>(p, stream);
    case 6:
      return LaunchVariant<kHeadDim, kMasked, 6>(p, stream);
    case 7:
      return LaunchVariant<kHeadDim, kMasked, 7>(p, stream);
    case 8:
      return LaunchVariant<kHeadDim, kMasked, 8>(p, stream);
    case 9:
      return LaunchVariant<kHeadDim, kMasked, 9>(p, stream);
    case 10:
      return LaunchVariant<kHeadDim, kMasked, 10>(p, stream);
    case 11:
      return LaunchVariant<kHeadDim, kMasked, 11>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

// p.variant is the effective one: at width 256 some variants give way to
// another (EffectiveVariant).
cudaError_t LaunchBf16Split(const DecodeKernelParams& p, cudaStream_t stream) {
  // Head dims up to 64 take the 64-wide kernels, up to 128 the 128-wide
  // ones, up to 256 the 256-wide ones, their dims past head_dim masked.
  // (Exact widths take instances without the masking.)
  const int32_t width = KernelHeadDim(p.head_dim);
  const bool masked = p.head_dim != width;
  if (width == 64) {
    return masked ? LaunchSplit<64, true>(p, stream) : LaunchSplit<64, false>(p, stream);
  } else if (width == 128) {
    return masked ? LaunchSplit<128, true>(p, stream) : LaunchSplit<128, false>(p, stream);
  }
  return masked ? LaunchSplit<256, true>(p, stream) : LaunchSplit<256, false>(p, stream);
}

}  // namespace

cudaError_t PagedDecode(const DecodeKernelParams& params, cudaStream_t stream) {
  if (params.batch == 0) return cudaSuccess;
  if (params.variant < 0 || params.variant >= kNumDecodeKernelVariants) {
    return cudaErrorInvalidValue;
  }
  DecodeKernelParams p = params;
  cudaError_t error;
  if (params.fp8 && kDecodeVariants[params.variant].kind == DecodeKernelKind::kWgmmaFp8 &&
      Fp8WgmmaSupports(params) && params.sm90) {
    error = LaunchFp8WgmmaSplit(p, stream);
  } else if (params.fp8) {
    p.variant = EffectiveFp8Variant(params.variant);
    error = LaunchFp8Split(p, stream);
  } else {
    p.variant = EffectiveVariant(params.variant, params.head_dim);
    error = LaunchBf16Split(p, stream);
  }
  if (error != cudaSuccess || p.partial_out == nullptr || MergesInClusters(p)) return error;
  // With pdl the merge kernel's launch overlaps the split kernel's tail; it
  // waits (griddepcontrol.wait) for the split kernel's results.
  return pdl::Launch(
      &DecodeMergeKernel,
      dim3(static_cast<unsigned>(params.num_q_heads), static_cast<unsigned>(params.batch)),
      dim3(static_cast<unsigned>(params.head_dim)), 0, stream, kDecodeVariants[p.variant].pdl, p);
}

}  // namespace trident::kernels::cuda::internal
