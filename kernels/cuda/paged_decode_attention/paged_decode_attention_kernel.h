#ifndef TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_PAGED_DECODE_ATTENTION_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_PAGED_DECODE_ATTENTION_KERNEL_H_

// The launchers nvcc compiles and the table of kernel variants the planner
// (paged_decode_attention.cc) and the launcher (paged_decode_attention.cu)
// share; paged_decode_attention.cc checks arguments before calling it.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trident::kernels::cuda::internal {

// One way to run the split kernel. kLegacy: the first kernel (128 threads,
// fp32 FMAs, two CTA-wide 16 KiB cp.async stages). kWgmmaFp8: Hopper's FP8
// kernel (paged_decode_attention_fp8_sm90.cu) over the FP8 cache at head_dim
// 128 on sm_90 devices, mma_w4_s2 elsewhere. kMma: tensor-core QK and
// PV (mma.sync m16n8k16, q heads as rows), `warps` warps per CTA each running
// its own `stages`-deep cp.async pipeline of 16-token chunks over every
// warps-th chunk of the CTA's split, merged through shared memory at the end;
// `pdl` launches the merge kernel with programmatic dependent launch.
// kMmaCluster: the kMma kernel whose 2 to kMaxClusterSplits splits of a
// (sequence, kv head) run as one thread block cluster and merge through
// distributed shared memory, with no merge kernel and no workspace (one
// split, or more than kMaxClusterSplits, run as kMma).
enum class DecodeKernelKind { kLegacy, kMma, kWgmmaFp8, kMmaCluster };

// The most splits a cluster merges (the portable cluster size).
inline constexpr int32_t kMaxClusterSplits = 8;

struct DecodeVariantSpec {
  DecodeKernelKind kind;
  int32_t warps;
  int32_t stages;
  bool pdl;
  const char* name;
};

inline constexpr DecodeVariantSpec kDecodeVariants[] = {
    {DecodeKernelKind::kLegacy, 4, 2, false, "legacy"},                 // 0
    {DecodeKernelKind::kMma, 4, 2, false, "mma_w4_s2"},                 // 1
    {DecodeKernelKind::kMma, 4, 3, false, "mma_w4_s3"},                 // 2
    {DecodeKernelKind::kMma, 4, 4, false, "mma_w4_s4"},                 // 3
    {DecodeKernelKind::kMma, 2, 4, false, "mma_w2_s4"},                 // 4
    {DecodeKernelKind::kMma, 8, 2, false, "mma_w8_s2"},                 // 5
    {DecodeKernelKind::kMma, 2, 3, false, "mma_w2_s3"},                 // 6
    {DecodeKernelKind::kMma, 4, 6, false, "mma_w4_s6"},                 // 7
    {DecodeKernelKind::kMma, 4, 3, true, "mma_w4_s3_pdl"},              // 8
    {DecodeKernelKind::kWgmmaFp8, 4, 4, false, "wgmma_fp8"},            // 9
    {DecodeKernelKind::kMmaCluster, 4, 2, false, "mma_w4_s2_cluster"},  // 10
    {DecodeKernelKind::kMmaCluster, 8, 2, false, "mma_w8_s2_cluster"},  // 11
};
inline constexpr int32_t kNumDecodeKernelVariants =
    static_cast<int32_t>(sizeof(kDecodeVariants) / sizeof(kDecodeVariants[0]));

#ifdef __CUDACC__
#define TRIDENT_DECODE_HOST_DEVICE __host__ __device__
#else
#define TRIDENT_DECODE_HOST_DEVICE
#endif

// Tokens per pipeline chunk of the mma kernel (one k step of the PV mma).
inline constexpr int32_t kMmaChunkTokens = 16;

// Dynamic shared memory of the mma kernel: per warp, `stages` chunks of K
// and V.
TRIDENT_DECODE_HOST_DEVICE constexpr int64_t MmaSharedBytes(int32_t warps, int32_t stages,
                                                            int32_t head_dim) {
  return static_cast<int64_t>(warps) * stages * kMmaChunkTokens * head_dim * 2 * 2;
}

// Resident CTAs per SM of the mma kernel on an H100 / H200 (228 KiB of shared
// memory per SM, 1 KiB of it reserved per CTA; 64 warps; 64 Ki registers):
// limited by shared memory, and by registers at 128 per thread (the kernel's
// __launch_bounds__ asks for this many CTAs, so ptxas keeps under the cap).
TRIDENT_DECODE_HOST_DEVICE constexpr int32_t MmaCtasPerSm(int32_t warps, int32_t stages,
                                                          int32_t head_dim) {
  const int64_t by_smem = (228 * 1024) / (MmaSharedBytes(warps, stages, head_dim) + 1024);
  const int64_t by_regs = 16 / warps;
  int64_t ctas = by_smem < by_regs ? by_smem : by_regs;
  ctas = ctas < 32 ? ctas : 32;
  return static_cast<int32_t>(ctas < 1 ? 1 : ctas);
}

// The width of the kernels a head_dim runs on (64, 128 or 256; the dims past
// head_dim are masked), and the variant that runs for `variant` there: at
// width 256 the legacy kernel and the variants whose stages outgrow an SM's
// shared memory give way to mma_w4_s2 (variant 1).
TRIDENT_DECODE_HOST_DEVICE constexpr int32_t KernelHeadDim(int32_t head_dim) {
  return head_dim <= 64 ? 64 : (head_dim <= 128 ? 128 : 256);
}
// Dynamic shared memory one CTA may take on an H100 / H200.
inline constexpr int64_t kMaxSharedBytesPerCta = 227 * 1024;
// Whether `spec` runs at kernel width `width`.
TRIDENT_DECODE_HOST_DEVICE constexpr bool VariantRunsAt(const DecodeVariantSpec& spec,
                                                        int32_t width) {
  if (spec.kind == DecodeKernelKind::kWgmmaFp8) return false;  // The bf16 cache: mma_w4_s2.
  return width <= 128 ||
         ((spec.kind == DecodeKernelKind::kMma || spec.kind == DecodeKernelKind::kMmaCluster) &&
          MmaSharedBytes(spec.warps, spec.stages, width) <= kMaxSharedBytesPerCta);
}
// (A cluster variant gives way to mma_w4_s2_cluster, which runs at every
// width: its splits then still merge in clusters.)
constexpr int32_t EffectiveVariant(int32_t variant, int32_t head_dim) {
  if (VariantRunsAt(kDecodeVariants[variant], KernelHeadDim(head_dim))) return variant;
  return kDecodeVariants[variant].kind == DecodeKernelKind::kMmaCluster ? 10 : 1;
}

// The FP8 mma kernel: per warp, `stages` chunks of K (16 tokens x head_dim
// bytes), V (head_dim x 16 bytes) and the chunk's 32 f32 scales; at least
// what the warps' final merge takes.
inline constexpr int64_t kFp8ScaleBytesPerChunk = 2 * kMmaChunkTokens * 4;
TRIDENT_DECODE_HOST_DEVICE constexpr int64_t MmaFp8StageBytes(int32_t head_dim) {
  return 2 * kMmaChunkTokens * head_dim + kFp8ScaleBytesPerChunk;
}
TRIDENT_DECODE_HOST_DEVICE constexpr int64_t MmaFp8SharedBytes(int32_t warps, int32_t stages,
                                                               int32_t head_dim) {
  const int64_t stage_bytes = static_cast<int64_t>(warps) * stages * MmaFp8StageBytes(head_dim);
  const int64_t merge_bytes = static_cast<int64_t>(warps) * (8 * head_dim + 16) * 4;
  return stage_bytes > merge_bytes ? stage_bytes : merge_bytes;
}
// The variant the FP8 mma kernel runs for `variant`: the mma ones as they
// are (all fit at every width), the legacy one as the default, wgmma_fp8
// (where Hopper's kernel does not apply) and the cluster ones as mma_w4_s2.
constexpr int32_t EffectiveFp8Variant(int32_t variant) {
  switch (kDecodeVariants[variant].kind) {
    case DecodeKernelKind::kLegacy:
      return 5;
    case DecodeKernelKind::kWgmmaFp8:
    case DecodeKernelKind::kMmaCluster:
      return 1;
    default:
      return variant;
  }
}

// Resident CTAs per SM of the legacy kernel (head_dim 128, GQA 4: 106
// registers x 128 threads).
inline constexpr int32_t kLegacyCtasPerSm = 4;

struct DecodeKernelParams {
  const void* q = nullptr;  // bf16
  int64_t q_stride = 0;
  void* out = nullptr;  // bf16
  int64_t out_stride = 0;
  const void* kv = nullptr;  // bf16, or FP8 E4M3 (fp8) in kernels/cpu/paged_kv_fp8's layout.
  bool fp8 = false;
  // Elements of the cache's type (bytes for FP8).
  int64_t block_stride = 0;
  int64_t value_offset = 0;
  int64_t scale_offset = 0;  // FP8: the block's f32 scales.
  int32_t block_size = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t group = 0;
  int32_t head_dim = 0;
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
  const int32_t* context_lens = nullptr;
  int32_t batch = 0;
  int32_t num_splits = 1;
  float scale_log2 = 0.0f;         // scale * log2(e): scores live in base 2.
  float* partial_out = nullptr;    // Null with one split.
  float* partial_stats = nullptr;  // (max, sum) pairs; null with one split.
  int32_t variant = 0;             // Index into kDecodeVariants.
  bool pdl = false;                // The split kernel's launch (PagedDecodeArgs::pdl).
  bool stable_prefix = false;      // PagedDecodeArgs::stable_prefix (mma kernels, bf16).
  // The device is sm_90 (kernels/cuda/arch): Hopper's kernel may run.
  bool sm90 = false;
};

// Launches the split kernel of params.variant and, with more than one split,
// the merge kernel.
cudaError_t PagedDecode(const DecodeKernelParams& params, cudaStream_t stream);

// The FP8 cache's split kernel (paged_decode_attention_fp8.cu) for
// EffectiveFp8Variant(params.variant); block_size a multiple of 16.
cudaError_t LaunchFp8Split(const DecodeKernelParams& params, cudaStream_t stream);

// Hopper's FP8 split kernel (paged_decode_attention_fp8_sm90.cu): whether it
// takes `params` (the FP8 cache, head_dim 128, a group of at most 8, blocks a
// multiple of 16; the device must be sm_90), and its launch.
bool Fp8WgmmaSupports(const DecodeKernelParams& params);
cudaError_t LaunchFp8WgmmaSplit(const DecodeKernelParams& params, cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_PAGED_DECODE_ATTENTION_KERNEL_H_
