#ifndef TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_PAGED_DECODE_ATTENTION_H_
#define TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_PAGED_DECODE_ATTENTION_H_

// Decode attention on the GPU over the project's paged KV cache (layout in
// kernels/cpu/paged_attention/paged_attention.h, the reference): one query
// token per sequence, the last position of its context, attending to every
// cached position (keys and values bf16, math fp32, output bf16).
//
// Flash-decoding: the context of each (sequence, kv head) is cut into
// `num_splits` pieces; one CTA per (kv head, split, sequence) reads its
// piece's K and V once for all the q heads of the kv head (GQA group 1..8),
// runs an online softmax per q head and writes an fp32 partial output with
// its (max, sum). A second kernel merges the splits (log-sum-exp) into bf16,
// or (the cluster variants, 2 to 8 splits) the splits of a (sequence, kv
// head) run as one thread block cluster and merge through distributed shared
// memory. With one split, or a cluster merge, the first kernel writes the
// bf16 output itself and no workspace is needed. Kernels take raw device pointers and a stream,
// never allocate and never synchronize.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace trident::kernels::cuda {

// The KV cache's element type: bf16, or FP8 E4M3 in the layout of
// kernels/cpu/paged_kv_fp8 (per-token, per-head scales; V transposed in
// 16-token groups).
enum class DecodeKvDtype { kBf16, kFp8E4M3 };

struct PagedDecodeArgs {
  // bf16 [batch][num_q_heads * head_dim], row stride q_stride elements (may
  // be a fused qkv row).
  const void* q = nullptr;
  int64_t q_stride = 0;
  // bf16 [batch][num_q_heads * head_dim], row stride out_stride elements;
  // elements past the heads are not written.
  void* out = nullptr;
  int64_t out_stride = 0;
  // One layer's paged KV: block b's K at kv_base + b * block_stride_elems,
  // its V value_offset_elems further, each [num_kv_heads][block_size][head_dim]
  // for bf16. kv_base must be 16-byte aligned and the offsets multiples of 16
  // bytes (the kernel reads 16-byte vectors). FP8: offsets count bytes, V is
  // transposed in groups of 16 tokens, the f32 scales sit scale_offset_elems
  // from the block's start, and block_size must be a multiple of 16.
  const void* kv_base = nullptr;
  DecodeKvDtype kv_dtype = DecodeKvDtype::kBf16;
  int64_t block_stride_elems = 0;
  int64_t value_offset_elems = 0;
  int64_t scale_offset_elems = 0;
  int32_t block_size = 16;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;  // A multiple of 16 in [16, 256] (64, 128, 256 unmasked).
  // Device [batch][max_blocks_per_seq]: physical block of each block_size
  // positions of the sequence. Entries past a sequence's context are not read.
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
  // Device [batch]: cached positions of each sequence, this step's token
  // included. 0 (a padding slot) gives an all-zero output row; values are
  // clamped to [0, max_blocks_per_seq * block_size].
  const int32_t* context_lens = nullptr;
  int32_t batch = 0;
  float scale = 1.0f;  // Softmax scale, usually 1 / sqrt(head_dim).
  // Launch the split kernel with programmatic dependent launch
  // (kernels/cuda/pdl): scheduled before the kernel ahead of it ends (the
  // KV append), waiting for it before any load.
  bool pdl = false;
  // With pdl: the kernels still running ahead of this one write no cached
  // position of these sequences but the last (this step's token), so the
  // mma variants over the bf16 cache copy their first chunks of K and V
  // before they wait, and read the last position again after. A decode
  // step's q/k/v projection (or KV append) ahead, with the step's inputs
  // uploaded before its first kernel, keeps this.
  bool stable_prefix = false;
};

// Kernel variants (all correct for every supported shape; they differ in
// speed): 0 is the first kernel (fp32 FMAs, 128 threads, two CTA-wide
// cp.async stages); the others use tensor cores with per-warp cp.async
// pipelines of 16-token chunks, `warps` x `stages` deep (see
// DecodeVariantName); 9, wgmma_fp8, is Hopper's FP8 kernel (wgmma on the
// stored E4M3 bytes, at head_dim 128 on sm_90 devices; over the bf16 cache
// and elsewhere it runs as mma_w4_s2). The benchmark compares them; PlanDecode picks
// kDefaultDecodeVariant, mma_w8_s2 (8 warps, 2 stages, one 128 KiB CTA per
// SM), the fastest or within 3% of it on every benchmark shape on the H200.
// 10 and 11 (mma_w4_s2_cluster, mma_w8_s2_cluster) are mma variants whose 2
// to 8 splits run as one thread block cluster and merge through distributed
// shared memory: no merge kernel and no workspace (over the FP8 cache they
// run as mma_w4_s2 with one split). PlanDecodeAuto takes one where its cost
// model says it pays: few sequences at short and middle contexts.
inline constexpr int32_t kNumDecodeVariants = 12;
inline constexpr int32_t kClusterDecodeVariant = 10;
inline constexpr int32_t kDefaultDecodeVariant = 5;
// Hopper's FP8 kernel (see above).
inline constexpr int32_t kWgmmaFp8DecodeVariant = 9;
// With many (sequence, KV head) items, at least kManyItemsPerSm per SM at
// head_dim 128, the planner takes mma_w2_s3 instead (2 warps, 3 stages,
// four 48 KiB CTAs per SM): on the H200, 0.86 of the read ceiling against
// mma_w8_s2's 0.75 at 64 sequences x 576 tokens, 0.89 against 0.81 at 128 x
// 576 and 0.95 against 0.93 at 128 x 2048; with fewer items (16 x 576, 1 x
// any) mma_w8_s2 stays ahead (bench/RESULTS.md).
inline constexpr int32_t kManyItemsDecodeVariant = 6;
inline constexpr int32_t kManyItemsPerSm = 2;
// Over an FP8 cache: mma_w4_s2 (kDefaultFp8DecodeVariant); with many
// (sequence, KV head) items, at least kManyItemsPerSm per SM, mma_w4_s3
// (kManyItemsFp8DecodeVariant); with few, at most one per kFewItemsSms SMs
// (one sequence of 8 KV heads on an H100 or H200), and past head_dim 128,
// mma_w8_s2 (kDefaultDecodeVariant: past head_dim 128 the 4-warp variants'
// launch bounds allow one CTA per SM). On the H200, mma_w4_s2 leads at 16
// sequences (149 against 190 us for mma_w8_s2 at 16 x 16384); mma_w4_s3 is
// within 1% of the best from 64 sequences up and 9% ahead of mma_w4_s2 at
// 128 x 2048; at one sequence mma_w8_s2 takes 34.5 against 37.3 us at
// 32768 tokens, and the 8B engine's step 4.58 against 4.73 ms at 16384; at
// head_dim 256, 16 x 16384, mma_w8_s2 takes 266 us against mma_w4_s2's
// 409 (bench/RESULTS.md).
inline constexpr int32_t kDefaultFp8DecodeVariant = 1;
inline constexpr int32_t kManyItemsFp8DecodeVariant = 2;
inline constexpr int32_t kFewItemsSms = 16;

// The bf16 variant PlanDecode takes for the shape: kManyItemsDecodeVariant
// when head_dim is 128 and batch x num_kv_heads >= kManyItemsPerSm x
// num_sms, else kDefaultDecodeVariant. It depends on the batch alone (not
// the context), so a plan per batch made for the longest context serves
// every shorter one.
int32_t DefaultDecodeVariant(int32_t batch, int32_t num_kv_heads, int32_t head_dim,
                             int32_t num_sms);

// The FP8 variant the backend takes for the shape (see above); like
// DefaultDecodeVariant it depends on the batch alone.
int32_t DefaultFp8DecodeVariant(int32_t batch, int32_t num_kv_heads, int32_t head_dim,
                                int32_t num_sms);

// "legacy", "mma_w4_s3", ...; "invalid" outside [0, kNumDecodeVariants).
const char* DecodeVariantName(int32_t variant);

// How the context is cut, and which kernel variant runs. Any num_splits in
// [1, kMaxDecodeSplits] is correct for any context lengths (each sequence
// cuts its own context into num_splits near-equal pieces; pieces past a
// short context are empty and ignored by the merge), so a plan made for the
// longest context serves every shorter one; PlanDecode picks one that fills
// the GPU.
struct DecodePlan {
  int32_t num_splits = 1;
  int32_t variant = kDefaultDecodeVariant;
};

inline constexpr int32_t kMaxDecodeSplits = 256;
// PlanDecode never makes pieces shorter than this (for max_context_len).
inline constexpr int32_t kMinDecodeSplitTokens = 256;

// Splits so that the batch * num_kv_heads * num_splits CTAs fill the SMs,
// counting the variant's resident CTAs per SM (at head_dim 128 for
// PlanDecode): the count whose last wave is fullest, the fewest such, with
// pieces of at least kMinDecodeSplitTokens (and 64 tokens per warp of the
// CTA) of max_context_len and at most kMaxDecodeSplits. Non-positive inputs
// give 1. The plan's variant is DefaultDecodeVariant's at head_dim 128
// (PlanDecode) or `variant`.
DecodePlan PlanDecode(int32_t batch, int32_t num_kv_heads, int32_t max_context_len,
                      int32_t num_sms);
DecodePlan PlanDecodeVariant(int32_t batch, int32_t num_kv_heads, int32_t head_dim,
                             int32_t max_context_len, int32_t num_sms, int32_t variant);

// The cheaper, by PlanDecodeVariant's cost model, of DefaultDecodeVariant's
// plan and (when batch * num_kv_heads * 8 CTAs fit one wave at head_dim <=
// 128) kClusterDecodeVariant's: what the backend runs over a bf16 cache. A
// cluster plan needs no workspace, so MaxDecodeWorkspaceBytes covers these.
DecodePlan PlanDecodeAuto(int32_t batch, int32_t num_kv_heads, int32_t head_dim,
                          int32_t max_context_len, int32_t num_sms);

// Resident CTAs per SM the planner assumes for `variant` at `head_dim` (0 for
// an invalid variant). For reports: bytes in flight per SM are about
// CTAs x warps x stages x 16 tokens x 4 x head_dim bytes for the mma variants.
int32_t DecodeCtasPerSm(int32_t variant, int32_t head_dim);

// Bytes of workspace LaunchPagedDecodeAttention needs: 0 for one split or a
// cluster variant's 2 to 8 splits, else
// fp32 partial outputs [batch][num_q_heads][num_splits][head_dim] followed by
// (max, sum) pairs [batch][num_q_heads][num_splits][2].
size_t DecodeWorkspaceBytes(const DecodePlan& plan, int32_t batch, int32_t num_q_heads,
                            int32_t head_dim);

// The most workspace PlanDecode's plans need for any batch in [1, max_batch]
// and any context up to max_context_len (the planner's split count never
// grows as the context shrinks, but it does as the batch shrinks): allocate
// this once for a server whose per-step plans come from PlanDecode.
size_t MaxDecodeWorkspaceBytes(int32_t max_batch, int32_t num_kv_heads, int32_t num_q_heads,
                               int32_t head_dim, int32_t max_context_len, int32_t num_sms);

// Enqueues the kernels on `stream`. kInvalidArgument (and no launch) naming
// the field for: head_dim not 64/128, num_q_heads not a multiple of
// num_kv_heads or a group above 8, non-positive block_size or
// max_blocks_per_seq, strides that do not hold a row or a block, misaligned
// kv_base or strides, null pointers with sequences to process, a batch above
// 65535, num_splits outside [1, kMaxDecodeSplits], a variant outside
// [0, kNumDecodeVariants), or (num_splits > 1) a null, misaligned or short
// workspace. kInternal if a launch fails. A batch
// of 0 is a no-op. REQUIRES (unchecked, device data): block tables cover each
// sequence's context with blocks inside the cache; out overlaps nothing read.
absl::Status LaunchPagedDecodeAttention(const PagedDecodeArgs& args, const DecodePlan& plan,
                                        void* workspace, size_t workspace_bytes,
                                        cudaStream_t stream);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_PAGED_DECODE_ATTENTION_PAGED_DECODE_ATTENTION_H_
