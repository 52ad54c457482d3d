// Decode attention over the FP8 E4M3 paged KV cache (kernels/cpu/paged_kv_fp8
// has the layout): the tensor-core kernel of paged_decode_attention.cu with
// K and V read as bytes, half of bf16's, and turned into fp16 MMA operands
// in registers.
//
// One CTA per (kv head, split, sequence) of kNumWarps warps; warp w takes the
// split's 16-token chunks w, w + kNumWarps, ... through its own kNumStages-
// deep cp.async pipeline. A chunk lies inside one block (block_size is a
// multiple of 16), so its K rows, its V group (16 tokens transposed: one
// 16-byte row per dim) and its 32 scales are each contiguous. Both products
// are taken transposed, so that the m16n8k16 fp16 MMA's 16 rows are all
// tokens or dims (the q heads, at most 8, are its 8 columns) and no operand
// or accumulator holds zeros that would be set again for every MMA:
//   S^T = K . Q^T  A = 16 tokens x 16 dims of K from one 32-bit shared load
//                  per (token, lane quad): the group's fragment order puts
//                  dims 2l, 2l + 1, 2l + 8, 2l + 9 at bytes 4l..4l + 3,
//                  exactly a lane's two A registers of one row; B = q
//                  (fp16, registers); each token's score times its K scale;
//   online softmax in base 2, per q head over the tokens (the lanes of a
//                  column);
//   P^T            the probabilities times each token's V scale over the
//                  chunk's largest (so in [0, 1] for fp16), turned from the
//                  accumulator layout into a B operand by movmatrix;
//   O^T += V^T . P^T  A = 16 dims x 16 tokens of the V group, one 32-bit
//                  load per (dim, lane quad) (tokens in fragment order);
//                  O is kept in units of that largest scale, rescaled when
//                  the next chunk's differs.
// K rows in shared memory have their 16-byte pieces swizzled by row, so the
// 8 rows of a load hit 8 different bank groups. Bytes of tokens past the
// context (stale, perhaps NaN) are masked: their scores are -inf and their V
// bytes and scales are zeroed.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/cuda/paged_decode_attention/decode_device.h"
#include "kernels/cuda/paged_decode_attention/paged_decode_attention_kernel.h"
#include "kernels/cuda/pdl/pdl_device.h"

namespace trident::kernels::cuda::internal {
namespace {

// d += A . B, an m16n8k16 fp16 MMA with f32 accumulators: a0..a3 are A's
// (row l/4, cols 2(l%4) + {0,1}), (row + 8, same), (row, cols + 8),
// (row + 8, cols + 8); b0, b1 B's (rows 2(l%4) + {0,1}, col l/4), (rows + 8,
// same); d the accumulators (row l/4, cols 2(l%4) + {0,1}), (row + 8, same).
__device__ __forceinline__ void MmaF16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 2^x in one instruction; results below 2^-126 flush to zero (probabilities
// that small add nothing to a sum of at least 1).
__device__ __forceinline__ float Exp2Approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The 8x8 matrix of 16-bit elements whose row l/4, cols 2(l%4) + {0,1} lane
// l holds, transposed across the warp.
__device__ __forceinline__ uint32_t Transpose8x8(uint32_t pair) {
  uint32_t out;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(out) : "r"(pair));
  return out;
}

__device__ __forceinline__ uint32_t PackHalf(float lo, float hi) {
  const __half2 pair = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// Two E4M3 bytes (low byte first) as an fp16 pair (low half first).
__device__ __forceinline__ uint32_t Fp8PairToHalf2(uint32_t two_bytes) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_bytes & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// The swizzled 16-byte piece of K row r (of kRowPieces pieces): the 8 rows
// of a 32-bit load land in 8 different 16-byte bank groups.
template <int kRowPieces>
__device__ __forceinline__ int SwizzledPiece(int r, int piece) {
  if constexpr (kRowPieces >= 8) {
    return piece ^ (r & 7);
  } else {
    return piece ^ ((r >> 1) & (kRowPieces - 1));
  }
}

// One chunk's online softmax over S^T (st: tokens row, row + 8 of heads
// 2 quad + {0, 1}, base-2 scores before the K scales): st becomes each
// probability times its token's V scale over the chunk's largest (`unit`
// after), zero past `valid`; run_max, run_sum and O^T (acc, in units of the
// old `unit`) are carried over.
template <int kDimTiles>
__device__ __forceinline__ void Fp8ChunkSoftmax(float (&st)[4], const float* k_scales,
                                                const float* v_scales, int valid, float scale_log2,
                                                float (&run_max)[2], float (&run_sum)[2],
                                                float& unit, float (&acc)[kDimTiles][4]) {
  const int row = static_cast<int>(threadIdx.x % 32) / 4;
  float v_scale[2];
  float v_unit = 0.0f;
  float chunk_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int t = row + 8 * j;
    const float k_scale = t < valid ? k_scales[t] * scale_log2 : 0.0f;
    v_scale[j] = t < valid ? v_scales[t] : 0.0f;
    v_unit = fmaxf(v_unit, v_scale[j]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      st[2 * j + h] = t < valid ? st[2 * j + h] * k_scale : -INFINITY;
      chunk_max[h] = fmaxf(chunk_max[h], st[2 * j + h]);
    }
  }
#pragma unroll
  for (int offset = 4; offset < 32; offset *= 2) {
    v_unit = fmaxf(v_unit, __shfl_xor_sync(~0u, v_unit, offset));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      chunk_max[h] = fmaxf(chunk_max[h], __shfl_xor_sync(~0u, chunk_max[h], offset));
    }
  }
  v_unit = v_unit > 0.0f ? v_unit : 1.0f;
  const float inverse_unit = 1.0f / v_unit;
  float rescale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float new_max = fmaxf(run_max[h], chunk_max[h]);
    const float alpha = Exp2Approx(run_max[h] - new_max);  // 0 on the first chunk.
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float prob = Exp2Approx(st[2 * j + h] - new_max);
      sum += prob;
      st[2 * j + h] = prob * (v_scale[j] * inverse_unit);
    }
    run_sum[h] = run_sum[h] * alpha + sum;
    run_max[h] = new_max;
    // O / v_unit = (O_old / unit) * alpha * unit / v_unit.
    rescale[h] = alpha * (unit * inverse_unit);
  }
  unit = v_unit;
#pragma unroll
  for (int mt = 0; mt < kDimTiles; ++mt) {
    acc[mt][0] *= rescale[0];
    acc[mt][1] *= rescale[1];
    acc[mt][2] *= rescale[0];
    acc[mt][3] *= rescale[1];
  }
}

// O^T (acc: dims 16 mt + row (+ 8) of heads 2 quad + {0, 1}) and the (max,
// sum) of those heads into StagedWarps, as StageWarpTiles stages O.
template <int kHeadDim, int kNumWarps>
__device__ __forceinline__ void StageTransposedWarp(unsigned char* smem,
                                                    const float (&acc)[kHeadDim / 16][4],
                                                    const float (&run_max)[2],
                                                    const float (&run_sum)[2]) {
  const StagedWarps<kHeadDim, kNumWarps> staged(smem);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = staged.warp * 8 + 2 * staged.quad + h;
#pragma unroll
    for (int mt = 0; mt < kHeadDim / 16; ++mt) {
      staged.o[head * kHeadDim + 16 * mt + staged.row] = acc[mt][h];
      staged.o[head * kHeadDim + 16 * mt + staged.row + 8] = acc[mt][2 + h];
    }
    if (staged.row == 0) {
      staged.m[head] = run_max[h];
      staged.l[head] = run_sum[h];
    }
  }
}

template <int kHeadDim, bool kMasked, int kNumWarps, int kNumStages>
__global__ void __launch_bounds__(kNumWarps * 32, MmaCtasPerSm(kNumWarps, kNumStages, kHeadDim))
    DecodeMmaFp8Kernel(const DecodeKernelParams p) {
  constexpr int kChunk = kMmaChunkTokens;
  constexpr int kRowPieces = kHeadDim / 16;  // 16-byte pieces per K row.
  constexpr int kKTileBytes = kChunk * kHeadDim;
  constexpr int kVTileBytes = kHeadDim * kChunk;
  constexpr int kStageBytes = static_cast<int>(MmaFp8StageBytes(kHeadDim));
  constexpr int kKSteps = kHeadDim / 16;
  constexpr int kDimTiles = kHeadDim / 16;  // Of O^T's rows.
  static_assert(kChunk == 16, "a chunk is one k step of the PV mma and one V group");
  static_assert(kStageBytes == kKTileBytes + kVTileBytes + kFp8ScaleBytesPerChunk,
                "a stage holds K, V and the scales");

  extern __shared__ __align__(128) unsigned char smem[];
  // As the bf16 kernels (paged_decode_attention.cu).
  pdl::LetDependentsLaunchThenWait();

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int kv_head = blockIdx.x;
  const int split = blockIdx.y;
  const int seq = blockIdx.z;
  const int row = lane / 4;   // Token or dim (+ 8) of the A loads; q head of B (q, P^T).
  const int quad = lane % 4;  // Heads 2 quad + {0, 1} of the accumulators.

  int64_t begin = 0;
  int64_t end = 0;
  SplitRange<kChunk>(p, seq, split, &begin, &end);
  const int num_chunks = static_cast<int>((end - begin + kChunk - 1) / kChunk);
  const int my_chunks = warp < num_chunks ? (num_chunks - warp + kNumWarps - 1) / kNumWarps : 0;

  // q as fp16 B fragments of Q^T: qa[ks][0] = q[row][16 ks + 2 quad + {0,1}],
  // [1] at + 8.
  const int hd = kMasked ? p.head_dim : kHeadDim;
  uint32_t qa[kKSteps][2];
  // fp16 holds |q| up to 65504; beyond it saturates.
  LoadQFragments<kKSteps>(
      p, seq, kv_head, row, quad, hd,
      [](__nv_bfloat162 pair) {
        const float lo = fminf(fmaxf(__bfloat162float(pair.x), -65504.0f), 65504.0f);
        const float hi = fminf(fmaxf(__bfloat162float(pair.y), -65504.0f), 65504.0f);
        return PackHalf(lo, hi);
      },
      qa);

  // O^T: acc[mt] = dims 16 mt + row (+ 8) of heads 2 quad + {0, 1}.
  float acc[kDimTiles][4];
#pragma unroll
  for (int mt = 0; mt < kDimTiles; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
  // Heads 2 quad + {0, 1}: the running max, and this lane's tokens' sum
  // (summed over the column's lanes at the end).
  float run_max[2] = {-INFINITY, -INFINITY};
  float run_sum[2] = {0.0f, 0.0f};
  float unit = 1.0f;  // acc holds O / unit.

  const unsigned char* kv = static_cast<const unsigned char*>(p.kv);
  const int32_t* table = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const int block_size = p.block_size;
  // Positions fit 32 bits (context_lens are int32).
  const FastDivisor block_div = MakeFastDivisor(static_cast<uint32_t>(block_size));
  const uint32_t warp_smem = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) +
                             static_cast<uint32_t>(warp * kNumStages * kStageBytes);
  const unsigned char* warp_smem_ptr = smem + warp * kNumStages * kStageBytes;

  auto chunk_start = [&](int i) -> int64_t {
    return begin + static_cast<int64_t>(warp + i * kNumWarps) * kChunk;
  };
  auto valid_tokens = [&](int64_t start) -> int {
    return static_cast<int>(end - start < kChunk ? end - start : kChunk);
  };
  auto fetch_block = [&](int i) -> int32_t {
    if (i >= my_chunks) return 0;
    return __ldg(table + FastDiv(static_cast<uint32_t>(chunk_start(i)), block_div));
  };
  // Each lane's K pieces of a chunk, fixed for the kernel: piece j is row
  // k_row0 + j * kRowsPerCopy, at k_src0 + j * kRowsPerCopy * hd past the
  // chunk's first row and at k_dst[j] in the stage.
  constexpr int kKCopies = kChunk * kRowPieces / 32;
  constexpr int kRowsPerCopy = 32 / kRowPieces;
  const int k_row0 = lane / kRowPieces;
  const int k_piece = lane % kRowPieces;
  const bool k_live = k_piece * 16 < hd;
  const uint32_t k_src0 = static_cast<uint32_t>(k_row0 * hd + k_piece * 16);
  uint32_t k_dst[kKCopies];
#pragma unroll
  for (int j = 0; j < kKCopies; ++j) {
    const int r = k_row0 + j * kRowsPerCopy;
    k_dst[j] = static_cast<uint32_t>(r * kHeadDim + SwizzledPiece<kRowPieces>(r, k_piece) * 16);
  }
  // Offsets in a block (which holds them all, far below 2^31 bytes): the
  // lane's first K piece in the kv head's rows, its V dim, and (lanes 0-7)
  // its 16 bytes of the scales (lanes 0-3: K's; 4-7: V's).
  const uint32_t k_lane = static_cast<uint32_t>(kv_head * block_size * hd) + k_src0;
  const uint32_t v_lane =
      static_cast<uint32_t>(p.value_offset + int64_t{kv_head} * block_size * hd + lane * 16);
  const uint32_t s_lane = static_cast<uint32_t>(
      p.scale_offset + (int64_t{lane / 4} * p.num_kv_heads + kv_head) * block_size * 4 +
      (lane % 4) * 16);
  // Starts the copies of the warp's chunk i into `stage`: K rows past the
  // context and pieces past head_dim are zero-filled (their addresses still
  // lie in the block: a chunk does not cross one); V rows (dims) past
  // head_dim are zero-filled, its tokens past the context masked later.
  auto issue_chunk = [&](int i, int32_t block, int stage) {
    const int64_t start = chunk_start(i);
    const int valid = valid_tokens(start);
    const uint32_t position = static_cast<uint32_t>(start);
    const uint32_t slot = position - FastDiv(position, block_div) * block_size;
    // The chunk's first row in the block, as seen from each of its parts.
    const unsigned char* chunk = kv + static_cast<int64_t>(block) * p.block_stride;
    const uint32_t row_bytes = slot * static_cast<uint32_t>(hd);
    const uint32_t k_dst_base = warp_smem + static_cast<uint32_t>(stage * kStageBytes);
    const uint32_t v_dst = k_dst_base + kKTileBytes;
    const uint32_t s_dst = v_dst + kVTileBytes;
    const unsigned char* k_src = chunk + (k_lane + row_bytes);
#pragma unroll
    for (int j = 0; j < kKCopies; ++j) {
      CpAsync16Shared(k_dst_base + k_dst[j], k_src + j * kRowsPerCopy * hd,
                      k_live && k_row0 + j * kRowsPerCopy < valid);
    }
    const unsigned char* v_src = chunk + (v_lane + row_bytes);
#pragma unroll
    for (int j = 0; j < kHeadDim / 32; ++j) {
      const bool live = lane + 32 * j < hd;
      CpAsync16Shared(v_dst + static_cast<uint32_t>((lane + 32 * j) * 16),
                      live ? v_src + j * 512 : kv, live);
    }
    if (lane < 8) {
      CpAsync16Shared(s_dst + static_cast<uint32_t>(lane * 16), chunk + (s_lane + slot * 4), true);
    }
  };

  int32_t first_blocks[kNumStages - 1];
#pragma unroll
  for (int s = 0; s < kNumStages - 1; ++s) first_blocks[s] = fetch_block(s);
  int32_t next_block = fetch_block(kNumStages - 1);
#pragma unroll
  for (int s = 0; s < kNumStages - 1; ++s) {
    if (s < my_chunks) issue_chunk(s, first_blocks[s], s);
    CpAsyncCommit();
  }

  for (int i = 0; i < my_chunks; ++i) {
    const int ahead = i + kNumStages - 1;
    if (ahead < my_chunks) {
      const int32_t block = next_block;
      next_block = fetch_block(ahead + 1);
      issue_chunk(ahead, block, ahead % kNumStages);
    }
    CpAsyncCommit();
    CpAsyncWait<kNumStages - 1>();
    __syncwarp();

    const int stage = i % kNumStages;
    const unsigned char* k_tile = warp_smem_ptr + stage * kStageBytes;
    const unsigned char* v_tile = k_tile + kKTileBytes;
    const float* k_scales = reinterpret_cast<const float*>(v_tile + kVTileBytes);
    const float* v_scales = k_scales + kChunk;
    const int valid = valid_tokens(chunk_start(i));

    // S^T = K . Q^T: st = tokens row (+ 8) of heads 2 quad + {0, 1}, summed
    // over the k steps in two chains (even and odd) that run side by side.
    float st[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float st_odd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      if (16 * ks >= hd) break;
      const uint32_t lo = *reinterpret_cast<const uint32_t*>(
          k_tile + row * kHeadDim + SwizzledPiece<kRowPieces>(row, ks) * 16 + 4 * quad);
      const uint32_t hi = *reinterpret_cast<const uint32_t*>(
          k_tile + (row + 8) * kHeadDim + SwizzledPiece<kRowPieces>(row + 8, ks) * 16 + 4 * quad);
      MmaF16(ks % 2 == 0 ? st : st_odd, Fp8PairToHalf2(lo), Fp8PairToHalf2(hi),
             Fp8PairToHalf2(lo >> 16), Fp8PairToHalf2(hi >> 16), qa[ks][0], qa[ks][1]);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) st[e] += st_odd[e];
    Fp8ChunkSoftmax(st, k_scales, v_scales, valid, p.scale_log2, run_max, run_sum, unit, acc);

    // O^T += V^T . P^T, with P^T (probabilities of heads row) from st.
    const uint32_t pb0 = Transpose8x8(PackHalf(st[0], st[1]));
    const uint32_t pb1 = Transpose8x8(PackHalf(st[2], st[3]));
    auto accumulate_pv = [&](uint32_t token_mask) {
#pragma unroll
      for (int mt = 0; mt < kDimTiles; ++mt) {
        if (16 * mt >= hd) break;
        const uint32_t lo =
            *reinterpret_cast<const uint32_t*>(v_tile + (16 * mt + row) * 16 + 4 * quad) &
            token_mask;
        const uint32_t hi =
            *reinterpret_cast<const uint32_t*>(v_tile + (16 * mt + row + 8) * 16 + 4 * quad) &
            token_mask;
        MmaF16(acc[mt], Fp8PairToHalf2(lo), Fp8PairToHalf2(hi), Fp8PairToHalf2(lo >> 16),
               Fp8PairToHalf2(hi >> 16), pb0, pb1);
      }
    };
    if (valid < kChunk) {
      // Bytes 4 quad + {0, 1, 2, 3} of a V row are tokens 2 quad + {0, 1, 8, 9}.
      accumulate_pv((2 * quad < valid ? 0xffu : 0u) | (2 * quad + 1 < valid ? 0xff00u : 0u) |
                    (2 * quad + 8 < valid ? 0xff0000u : 0u) |
                    (2 * quad + 9 < valid ? 0xff000000u : 0u));
    } else {
      accumulate_pv(~0u);
    }
    __syncwarp();
  }
  CpAsyncWait<0>();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int offset = 4; offset < 32; offset *= 2) {
      run_sum[h] += __shfl_xor_sync(~0u, run_sum[h], offset);
    }
  }
#pragma unroll
  for (int mt = 0; mt < kDimTiles; ++mt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[mt][e] *= unit;
  }
  __syncthreads();  // All warps are done with their stages.
  StageTransposedWarp<kHeadDim, kNumWarps>(smem, acc, run_max, run_sum);
  ReduceStagedWarps<kHeadDim, kNumWarps>(
      p, smem, hd, [&](int g, int d, float value, float max, float denom) {
        StoreSplitResult(p, seq, split, kv_head * p.group + g, hd, d, value, max, denom);
      });
}

template <int kHeadDim, bool kMasked, int kNumWarps, int kNumStages>
cudaError_t LaunchFp8Kernel(const DecodeKernelParams& p, cudaStream_t stream) {
  constexpr int64_t kSmemBytes = MmaFp8SharedBytes(kNumWarps, kNumStages, kHeadDim);
  static_assert(kSmemBytes <= kMaxSharedBytesPerCta, "fits one SM's shared memory");
  void (*kernel)(DecodeKernelParams) = DecodeMmaFp8Kernel<kHeadDim, kMasked, kNumWarps, kNumStages>;
  static std::atomic<uint64_t> configured{0};
  const cudaError_t error = ConfigureSharedMemoryOnce(kernel, kSmemBytes, configured);
  if (error != cudaSuccess) return error;
  const dim3 grid(static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(p.num_splits),
                  static_cast<unsigned>(p.batch));
  return pdl::Launch(kernel, grid, dim3(kNumWarps * 32), static_cast<size_t>(kSmemBytes), stream,
                     p.pdl, p);
}

template <int kHeadDim, bool kMasked, int kVariant>
cudaError_t LaunchFp8Variant(const DecodeKernelParams& p, cudaStream_t stream) {
  constexpr DecodeVariantSpec kSpec = kDecodeVariants[kVariant];
  if constexpr (kSpec.kind != DecodeKernelKind::kMma) {
    return cudaErrorInvalidValue;  // LaunchFp8Split runs EffectiveFp8Variant.
  } else {
    return LaunchFp8Kernel<kHeadDim, kMasked, kSpec.warps, kSpec.stages>(p, stream);
  }
}

template <int kHeadDim, bool kMasked>
cudaError_t LaunchFp8Width(const DecodeKernelParams& p, cudaStream_t stream) {
  static_assert(kNumDecodeKernelVariants == 12,
                "one case per variant below (the cluster ones run as 1)");
  switch (p.variant) {
    case 1:
      return LaunchFp8Variant<kHeadDim, kMasked, 1>(p, stream);
    case 2:
      return LaunchFp8Variant<kHeadDim, kMasked, 2>(p, stream);
    case 3:
      return LaunchFp8Variant<kHeadDim, kMasked, 3>(p, stream);
    case 4:
      return LaunchFp8Variant<kHeadDim, kMasked, 4>(p, stream);
    case 5:
      return LaunchFp8Variant<kHeadDim, kMasked, 5>(p, stream);
    case 6:
      return LaunchFp8Variant<kHeadDim, kMasked, 6>(p, stream);
    case 7:
      return LaunchFp8Variant<kHeadDim, kMasked, 7>(p, stream);
    case 8:
      return LaunchFp8Variant<kHeadDim, kMasked, 8>(p, stream);
    case 9:
      return LaunchFp8Variant<kHeadDim, kMasked, 9>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t LaunchFp8Split(const DecodeKernelParams& p, cudaStream_t stream) {
  if (p.block_size % kMmaChunkTokens != 0) return cudaErrorInvalidValue;
  const int32_t width = KernelHeadDim(p.head_dim);
  const bool masked = p.head_dim != width;
  if (width == 64) {
    return masked ? LaunchFp8Width<64, true>(p, stream) : LaunchFp8Width<64, false>(p, stream);
  } else if (width == 128) {
    return masked ? LaunchFp8Width<128, true>(p, stream) : LaunchFp8Width<128, false>(p, stream);
  }
  return masked ? LaunchFp8Width<256, true>(p, stream) : LaunchFp8Width<256, false>(p, stream);
}

}  // namespace trident::kernels::cuda::internal
