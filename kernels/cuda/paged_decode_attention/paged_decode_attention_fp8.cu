// Decode attention over the FP8 E4M3 paged KV cache (kernels/cpu/paged_kv_fp8
// has the layout): the tensor-core kernel of paged_decode_attention.cu with
// K and V read as bytes, half of bf16's, and turned into fp16 MMA operands
// in registers.
//
// One CTA per (kv head, split, sequence) of kNumWarps warps; warp w takes the
// split's 16-token chunks w, w + kNumWarps, ... through its own kNumStages-
// deep cp.async pipeline. A chunk lies inside one block (block_size is a
// multiple of 16), so its K rows, its V group (16 tokens transposed: one
// 16-byte row per dim) and its 32 scales are each contiguous. Per chunk:
//   S = Q . K^T    mma m16n8k16 f16: A = q (fp16, registers), B from one
//                  32-bit shared load per (8 tokens, 16 dims): the group's
//                  fragment order puts dims 2l, 2l + 1, 2l + 8, 2l + 9 at
//                  bytes 4l..4l + 3, exactly lane quad l's two B registers;
//                  each token's score times its K scale;
//   online softmax in base 2;
//   O += P . V     A = P times each token's V scale over the chunk's largest
//                  (so in [0, 1] for fp16), B from one 32-bit load per 8 dims
//                  (tokens in fragment order); O is kept in units of that
//                  largest scale, rescaled when the next chunk's differs.
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

// d[row l/4][2(l%4) + {0,1}] += A . B, an m16n8k16 fp16 MMA whose A rows
// 8..15 are zero (as MmaTopRows in paged_decode_attention.cu).
__device__ __forceinline__ void MmaTopRowsF16(float& d0, float& d1, uint32_t a0, uint32_t a2,
                                              uint32_t b0, uint32_t b1) {
  [[maybe_unused]] float unused0;
  [[maybe_unused]] float unused1;
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %10, %11};\n"
      : "+f"(d0), "+f"(d1), "=f"(unused0), "=f"(unused1)
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1), "f"(0.0f), "f"(0.0f));
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

template <int kHeadDim, bool kMasked, int kNumWarps, int kNumStages>
__global__ void __launch_bounds__(kNumWarps * 32, MmaCtasPerSm(kNumWarps, kNumStages, kHeadDim))
    DecodeMmaFp8Kernel(const DecodeKernelParams p) {
  constexpr int kChunk = kMmaChunkTokens;
  constexpr int kRowPieces = kHeadDim / 16;  // 16-byte pieces per K row.
  constexpr int kKTileBytes = kChunk * kHeadDim;
  constexpr int kVTileBytes = kHeadDim * kChunk;
  constexpr int kStageBytes = static_cast<int>(MmaFp8StageBytes(kHeadDim));
  constexpr int kKSteps = kHeadDim / 16;
  constexpr int kDimTiles = kHeadDim / 8;
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
  const int row = lane / 4;   // Head of the accumulators; token (or dim) of the B loads.
  const int quad = lane % 4;  // Tokens / dims 2 quad + {0, 1} (+ 8) of each tile.

  int64_t begin = 0;
  int64_t end = 0;
  SplitRange<kChunk>(p, seq, split, &begin, &end);
  const int num_chunks = static_cast<int>((end - begin + kChunk - 1) / kChunk);
  const int my_chunks = warp < num_chunks ? (num_chunks - warp + kNumWarps - 1) / kNumWarps : 0;

  // q as fp16 A fragments: qa[ks][0] = q[row][16 ks + 2 quad + {0,1}], [1] at + 8.
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

  float acc[kDimTiles][2];
#pragma unroll
  for (int nt = 0; nt < kDimTiles; ++nt) acc[nt][0] = acc[nt][1] = 0.0f;
  float run_max = -INFINITY;
  float run_sum = 0.0f;  // This lane's tokens; summed over the quad at the end.
  float unit = 1.0f;     // acc holds O / unit.

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
  // Starts the copies of the warp's chunk i into `stage`: K rows past the
  // context and pieces past head_dim are zero-filled; V rows (dims) past
  // head_dim are zero-filled, its tokens past the context masked later.
  auto issue_chunk = [&](int i, int32_t block, int stage) {
    const int64_t start = chunk_start(i);
    const int valid = valid_tokens(start);
    const uint32_t position = static_cast<uint32_t>(start);
    const int slot = static_cast<int>(position - FastDiv(position, block_div) * block_size);
    const unsigned char* block_base = kv + static_cast<int64_t>(block) * p.block_stride;
    const uint32_t k_dst = warp_smem + static_cast<uint32_t>(stage * kStageBytes);
    const uint32_t v_dst = k_dst + kKTileBytes;
    const uint32_t s_dst = v_dst + kVTileBytes;
    const unsigned char* k_src =
        block_base + (static_cast<int64_t>(kv_head) * block_size + slot) * hd;
#pragma unroll
    for (int j = 0; j < kChunk * kRowPieces / 32; ++j) {
      const int piece_index = lane + 32 * j;
      const int r = piece_index / kRowPieces;
      const int piece = piece_index % kRowPieces;
      const bool ok = r < valid && piece * 16 < hd;
      CpAsync16Shared(
          k_dst + static_cast<uint32_t>(r * kHeadDim + SwizzledPiece<kRowPieces>(r, piece) * 16),
          ok ? k_src + r * hd + piece * 16 : kv, ok);
    }
    const unsigned char* v_src =
        block_base + p.value_offset +
        (static_cast<int64_t>(kv_head) * (block_size / kChunk) + slot / kChunk) * hd * kChunk;
#pragma unroll
    for (int j = 0; j < kHeadDim / 32; ++j) {
      const int d = lane + 32 * j;
      CpAsync16Shared(v_dst + static_cast<uint32_t>(d * 16), d < hd ? v_src + d * 16 : kv, d < hd);
    }
    if (lane < 8) {
      // Lanes 0-3: the chunk's K scales; 4-7: its V scales.
      const int which = lane / 4;
      const unsigned char* s_src =
          block_base + p.scale_offset +
          ((static_cast<int64_t>(which) * p.num_kv_heads + kv_head) * block_size + slot) * 4 +
          (lane % 4) * 16;
      CpAsync16Shared(s_dst + static_cast<uint32_t>(lane * 16), s_src, true);
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

    // S = Q . K^T for tokens 0..7 (s[0]) and 8..15 (s[1]).
    float s[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      if (16 * ks >= hd) break;
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int r = 8 * j + row;
        const uint32_t word = *reinterpret_cast<const uint32_t*>(
            k_tile + r * kHeadDim + SwizzledPiece<kRowPieces>(r, ks) * 16 + 4 * quad);
        MmaTopRowsF16(s[j][0], s[j][1], qa[ks][0], qa[ks][1], Fp8PairToHalf2(word),
                      Fp8PairToHalf2(word >> 16));
      }
    }

    // Scores (base 2) with each token's K scale; the chunk's largest V scale.
    float chunk_max = -INFINITY;
    float v_scale[2][2];
    float v_unit = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 8 * j + 2 * quad + e;
        s[j][e] = t < valid ? s[j][e] * (k_scales[t] * p.scale_log2) : -INFINITY;
        v_scale[j][e] = t < valid ? v_scales[t] : 0.0f;
        chunk_max = fmaxf(chunk_max, s[j][e]);
        v_unit = fmaxf(v_unit, v_scale[j][e]);
      }
    }
    chunk_max = fmaxf(chunk_max, __shfl_xor_sync(~0u, chunk_max, 1));
    chunk_max = fmaxf(chunk_max, __shfl_xor_sync(~0u, chunk_max, 2));
    v_unit = fmaxf(v_unit, __shfl_xor_sync(~0u, v_unit, 1));
    v_unit = fmaxf(v_unit, __shfl_xor_sync(~0u, v_unit, 2));
    v_unit = v_unit > 0.0f ? v_unit : 1.0f;
    const float new_max = fmaxf(run_max, chunk_max);
    const float alpha = exp2f(run_max - new_max);  // 0 on the first chunk.
    float sum = 0.0f;
    float pv[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float prob = exp2f(s[j][e] - new_max);
        sum += prob;
        pv[j][e] = prob * (v_scale[j][e] / v_unit);
      }
    }
    run_sum = run_sum * alpha + sum;
    run_max = new_max;
    const uint32_t pa0 = PackHalf(pv[0][0], pv[0][1]);
    const uint32_t pa2 = PackHalf(pv[1][0], pv[1][1]);

    // O / v_unit = (O_old / unit) * alpha * unit / v_unit + P' . V.
    const float rescale = alpha * (unit / v_unit);
    unit = v_unit;
#pragma unroll
    for (int nt = 0; nt < kDimTiles; ++nt) {
      acc[nt][0] *= rescale;
      acc[nt][1] *= rescale;
    }
    // Bytes 4 quad + {0, 1, 2, 3} of a V row are tokens 2 quad + {0, 1, 8, 9}.
    uint32_t token_mask = ~0u;
    if (valid < kChunk) {
      token_mask = (2 * quad < valid ? 0xffu : 0u) | (2 * quad + 1 < valid ? 0xff00u : 0u) |
                   (2 * quad + 8 < valid ? 0xff0000u : 0u) |
                   (2 * quad + 9 < valid ? 0xff000000u : 0u);
    }
#pragma unroll
    for (int nt = 0; nt < kDimTiles; ++nt) {
      if (8 * nt >= hd) break;
      const uint32_t word =
          *reinterpret_cast<const uint32_t*>(v_tile + (8 * nt + row) * 16 + 4 * quad) & token_mask;
      MmaTopRowsF16(acc[nt][0], acc[nt][1], pa0, pa2, Fp8PairToHalf2(word),
                    Fp8PairToHalf2(word >> 16));
    }
    __syncwarp();
  }
  CpAsyncWait<0>();
  run_sum += __shfl_xor_sync(~0u, run_sum, 1);
  run_sum += __shfl_xor_sync(~0u, run_sum, 2);
#pragma unroll
  for (int nt = 0; nt < kDimTiles; ++nt) {
    acc[nt][0] *= unit;
    acc[nt][1] *= unit;
  }
  __syncthreads();  // All warps are done with their stages.
  MergeWarpsAndWrite<kHeadDim, kNumWarps>(p, smem, acc, run_max, run_sum, hd, kv_head, split, seq);
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
