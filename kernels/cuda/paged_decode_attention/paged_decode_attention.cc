#include "kernels/cuda/paged_decode_attention/paged_decode_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/arch/arch.h"
#include "kernels/cuda/paged_decode_attention/paged_decode_attention_kernel.h"

namespace trident::kernels::cuda {
namespace {

constexpr int32_t kMaxGroup = 8;
constexpr int32_t kMaxGridYz = 65535;

static_assert(kNumDecodeVariants == internal::kNumDecodeKernelVariants,
              "the public variant count matches the kernel table");
static_assert(kDefaultDecodeVariant >= 0 && kDefaultDecodeVariant < kNumDecodeVariants,
              "the default variant exists");
static_assert(internal::kDecodeVariants[kWgmmaFp8DecodeVariant].kind ==
                  internal::DecodeKernelKind::kWgmmaFp8,
              "kWgmmaFp8DecodeVariant names Hopper's FP8 kernel");

bool ValidVariant(int32_t variant) { return variant >= 0 && variant < kNumDecodeVariants; }

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("paged_decode_attention: ", what));
}

bool Aligned(const void* ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// The cache layout: K, V (and FP8's scales) inside a block, in that order,
// at 16-byte aligned offsets.
absl::Status ValidateLayout(const PagedDecodeArgs& a) {
  const bool fp8 = a.kv_dtype == DecodeKvDtype::kFp8E4M3;
  if (!fp8 && a.kv_dtype != DecodeKvDtype::kBf16) return Invalid("kv_dtype is not bf16 or fp8");
  if (fp8 && a.block_size % 16 != 0) {
    return Invalid(
        absl::StrCat("block_size ", a.block_size, " must be a multiple of 16 for an FP8 cache"));
  }
  const int64_t half = static_cast<int64_t>(a.num_kv_heads) * a.block_size * a.head_dim;
  if (a.value_offset_elems < half) {
    return Invalid(absl::StrCat("value_offset_elems ", a.value_offset_elems, " is less than the ",
                                half, " elements of a block's keys"));
  }
  const int64_t values_end = a.value_offset_elems + half;
  const int64_t scales = fp8 ? static_cast<int64_t>(2) * a.num_kv_heads * a.block_size * 4 : 0;
  if (fp8 && a.scale_offset_elems < values_end) {
    return Invalid(absl::StrCat("scale_offset_elems ", a.scale_offset_elems,
                                " is less than value_offset_elems + the ", half,
                                " bytes of a block's values"));
  }
  const int64_t block_end = fp8 ? a.scale_offset_elems + scales : values_end;
  if (a.block_stride_elems < block_end) {
    return Invalid(absl::StrCat("block_stride_elems ", a.block_stride_elems,
                                " does not hold a block's keys, values", fp8 ? " and scales" : "",
                                " (", block_end, ")"));
  }
  const int64_t unit = fp8 ? 16 : 8;  // Elements in 16 bytes.
  if (a.block_stride_elems % unit != 0 || a.value_offset_elems % unit != 0 ||
      (fp8 && a.scale_offset_elems % unit != 0)) {
    return Invalid(absl::StrCat(
        "block_stride_elems ", a.block_stride_elems, ", value_offset_elems ", a.value_offset_elems,
        fp8 ? absl::StrCat(" and scale_offset_elems ", a.scale_offset_elems) : std::string(),
        " must be multiples of ", unit, " (16-byte loads)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateArgs(const PagedDecodeArgs& a, const DecodePlan& plan) {
  if (a.batch < 0 || a.batch > kMaxGridYz) {
    return Invalid(absl::StrCat("batch ", a.batch, " must be in [0, ", kMaxGridYz, "]"));
  }
  if (a.head_dim < 16 || a.head_dim > 256 || a.head_dim % 16 != 0) {
    return Invalid(absl::StrCat("head_dim ", a.head_dim, " must be a multiple of 16 in [16, 256]"));
  }
  if (a.num_kv_heads <= 0 || a.num_q_heads <= 0 || a.num_q_heads % a.num_kv_heads != 0 ||
      a.num_q_heads / a.num_kv_heads > kMaxGroup) {
    return Invalid(absl::StrCat("num_q_heads ", a.num_q_heads, " must be a positive multiple of ",
                                "num_kv_heads ", a.num_kv_heads, " at most ", kMaxGroup,
                                " times it"));
  }
  if (a.block_size <= 0 || a.max_blocks_per_seq <= 0) {
    return Invalid(absl::StrCat("block_size ", a.block_size, " and max_blocks_per_seq ",
                                a.max_blocks_per_seq, " must be positive"));
  }
  if (static_cast<int64_t>(a.block_size) * a.max_blocks_per_seq > INT32_MAX) {
    return Invalid("block_size * max_blocks_per_seq exceeds 2^31 - 1 positions");
  }
  const int64_t row = static_cast<int64_t>(a.num_q_heads) * a.head_dim;
  if (a.q_stride < row || a.out_stride < row) {
    return Invalid(absl::StrCat("q_stride ", a.q_stride, " and out_stride ", a.out_stride,
                                " must hold num_q_heads * head_dim = ", row, " elements"));
  }
  if (absl::Status s = ValidateLayout(a); !s.ok()) return s;
  if (!ValidVariant(plan.variant)) {
    return Invalid(
        absl::StrCat("plan.variant ", plan.variant, " must be in [0, ", kNumDecodeVariants, ")"));
  }
  if (plan.num_splits < 1 || plan.num_splits > kMaxDecodeSplits) {
    return Invalid(absl::StrCat("plan.num_splits ", plan.num_splits, " must be in [1, ",
                                kMaxDecodeSplits, "]"));
  }
  if (a.batch > 0) {
    if (a.q == nullptr || a.out == nullptr || a.kv_base == nullptr || a.block_tables == nullptr ||
        a.context_lens == nullptr) {
      return Invalid("q, out, kv_base, block_tables and context_lens must be non-null");
    }
    if (!Aligned(a.kv_base, 16)) return Invalid("kv_base must be 16-byte aligned");
    if (!Aligned(a.q, 2) || !Aligned(a.out, 2)) return Invalid("q and out must be 2-byte aligned");
    if (!Aligned(a.block_tables, 4) || !Aligned(a.context_lens, 4)) {
      return Invalid("block_tables and context_lens must be 4-byte aligned");
    }
  }
  if (!std::isfinite(a.scale)) return Invalid("scale must be finite");
  return absl::OkStatus();
}

}  // namespace

const char* DecodeVariantName(int32_t variant) {
  return ValidVariant(variant) ? internal::kDecodeVariants[variant].name : "invalid";
}

int32_t DecodeCtasPerSm(int32_t variant, int32_t head_dim) {
  if (!ValidVariant(variant)) return 0;
  const internal::DecodeVariantSpec& spec =
      internal::kDecodeVariants[internal::EffectiveVariant(variant, head_dim)];
  if (spec.kind == internal::DecodeKernelKind::kLegacy) return internal::kLegacyCtasPerSm;
  return internal::MmaCtasPerSm(spec.warps, spec.stages, internal::KernelHeadDim(head_dim));
}

DecodePlan PlanDecode(int32_t batch, int32_t num_kv_heads, int32_t max_context_len,
                      int32_t num_sms) {
  return PlanDecodeVariant(batch, num_kv_heads, 128, max_context_len, num_sms,
                           DefaultDecodeVariant(batch, num_kv_heads, 128, num_sms));
}

int32_t DefaultDecodeVariant(int32_t batch, int32_t num_kv_heads, int32_t head_dim,
                             int32_t num_sms) {
  const int64_t items = int64_t{batch} * num_kv_heads;
  return head_dim == 128 && num_sms > 0 && items >= int64_t{kManyItemsPerSm} * num_sms
             ? kManyItemsDecodeVariant
             : kDefaultDecodeVariant;
}

int32_t DefaultFp8DecodeVariant(int32_t batch, int32_t num_kv_heads, int32_t head_dim,
                                int32_t num_sms) {
  const int64_t items = int64_t{batch} * num_kv_heads;
  if (head_dim > 128 || items * kFewItemsSms <= num_sms) return kDefaultDecodeVariant;
  return num_sms > 0 && items >= int64_t{kManyItemsPerSm} * num_sms ? kManyItemsFp8DecodeVariant
                                                                    : kDefaultFp8DecodeVariant;
}

namespace {

// Cost of `splits` in units of one CTA's time per token: waves of resident
// CTAs x (tokens per split + a fixed cost per CTA: start-up and the first
// loads' latency, not all of it hidden by the SM's other CTAs) + the merge
// kernel's launch where one runs. Tokens per split are counted exactly (not
// rounded up to whole chunks): then the chosen count never decreases as
// max_context_len grows (a larger count only wins at a longer context if its
// waves are fuller per token), so a plan's workspace for the longest context
// covers every shorter one.
// `token_cost` scales a CTA's time per token (1: the 8-warp kernel).
double SplitCost(int64_t items, int64_t slots, int64_t splits, int32_t max_context_len,
                 bool merge_kernel, double token_cost = 1.0) {
  constexpr double kCtaOverheadTokens = 64.0;
  constexpr double kMergeOverheadTokens = 100.0;
  const int64_t waves = (items * splits + slots - 1) / slots;
  return static_cast<double>(waves) *
             (token_cost * static_cast<double>(max_context_len) / static_cast<double>(splits) +
              kCtaOverheadTokens) +
         (merge_kernel ? kMergeOverheadTokens : 0.0);
}

bool IsCluster(int32_t variant) {
  return internal::kDecodeVariants[variant].kind == internal::DecodeKernelKind::kMmaCluster;
}

// Whether the plan's splits merge in clusters (bf16): no merge kernel.
bool ClusterMerge(const DecodePlan& plan) {
  return ValidVariant(plan.variant) && IsCluster(plan.variant) && plan.num_splits >= 2 &&
         plan.num_splits <= internal::kMaxClusterSplits;
}

// The cheapest split count and its cost; the fewest splits on ties.
std::pair<int32_t, double> BestSplits(int64_t items, int64_t slots, int64_t longest,
                                      int32_t max_context_len, bool cluster,
                                      double token_cost = 1.0) {
  int32_t best = 1;
  double best_cost = 0.0;
  for (int64_t splits = 1; splits <= longest; ++splits) {
    const bool merge_kernel = splits > 1 && !(cluster && splits <= internal::kMaxClusterSplits);
    const double cost = SplitCost(items, slots, splits, max_context_len, merge_kernel, token_cost);
    if (splits == 1 || cost < best_cost * (1.0 - 1e-12)) {
      best_cost = cost;
      best = static_cast<int32_t>(splits);
    }
  }
  return {best, best_cost};
}

std::pair<DecodePlan, double> PlanWithCost(int32_t batch, int32_t num_kv_heads, int32_t head_dim,
                                           int32_t max_context_len, int32_t num_sms,
                                           int32_t variant) {
  DecodePlan plan;
  plan.variant = variant;
  if (batch <= 0 || num_kv_heads <= 0 || max_context_len <= 0 || num_sms <= 0 ||
      !ValidVariant(variant)) {
    return {plan, 0.0};
  }
  const internal::DecodeVariantSpec& spec = internal::kDecodeVariants[variant];
  const int64_t items = static_cast<int64_t>(batch) * num_kv_heads;
  const int64_t slots = static_cast<int64_t>(num_sms) * DecodeCtasPerSm(variant, head_dim);
  if (IsCluster(variant)) {
    // A cluster's splits are at least one chunk per warp, at most 8. Its
    // CTAs are priced by their warps against the 8-warp kernel's: on the
    // H200 the 4-warp one led mma_w8_s2 at batch 1 up to 2048 tokens and
    // fell behind from 4096 (bench/RESULTS.md).
    const int64_t longest =
        std::clamp<int64_t>(max_context_len / (int64_t{internal::kMmaChunkTokens} * spec.warps), 1,
                            internal::kMaxClusterSplits);
    const auto [splits, cost] =
        BestSplits(items, slots, longest, max_context_len, true, 8.0 / spec.warps);
    plan.num_splits = splits;
    return {plan, cost};
  }
  const int64_t min_tokens = std::max<int64_t>(
      kMinDecodeSplitTokens,
      spec.kind == internal::DecodeKernelKind::kMma ? int64_t{64} * spec.warps : 0);
  const int64_t longest = std::clamp<int64_t>(max_context_len / min_tokens, 1, kMaxDecodeSplits);
  const auto [splits, cost] = BestSplits(items, slots, longest, max_context_len, false);
  plan.num_splits = splits;
  return {plan, cost};
}

}  // namespace

DecodePlan PlanDecodeVariant(int32_t batch, int32_t num_kv_heads, int32_t head_dim,
                             int32_t max_context_len, int32_t num_sms, int32_t variant) {
  return PlanWithCost(batch, num_kv_heads, head_dim, max_context_len, num_sms, variant).first;
}

DecodePlan PlanDecodeAuto(int32_t batch, int32_t num_kv_heads, int32_t head_dim,
                          int32_t max_context_len, int32_t num_sms) {
  const auto [plan, cost] =
      PlanWithCost(batch, num_kv_heads, head_dim, max_context_len, num_sms,
                   DefaultDecodeVariant(batch, num_kv_heads, head_dim, num_sms));
  const int64_t cluster_ctas = int64_t{batch} * num_kv_heads * internal::kMaxClusterSplits;
  if (head_dim > 128 ||
      cluster_ctas > int64_t{num_sms} * DecodeCtasPerSm(kClusterDecodeVariant, head_dim)) {
    return plan;
  }
  const auto [cluster_plan, cluster_cost] =
      PlanWithCost(batch, num_kv_heads, head_dim, max_context_len, num_sms, kClusterDecodeVariant);
  return cluster_cost < cost ? cluster_plan : plan;
}

size_t DecodeWorkspaceBytes(const DecodePlan& plan, int32_t batch, int32_t num_q_heads,
                            int32_t head_dim) {
  if (plan.num_splits <= 1 || ClusterMerge(plan) || batch <= 0 || num_q_heads <= 0 ||
      head_dim <= 0) {
    return 0;
  }
  const size_t rows = static_cast<size_t>(batch) * num_q_heads * plan.num_splits;
  return rows * (static_cast<size_t>(head_dim) + 2) * sizeof(float);
}

size_t MaxDecodeWorkspaceBytes(int32_t max_batch, int32_t num_kv_heads, int32_t num_q_heads,
                               int32_t head_dim, int32_t max_context_len, int32_t num_sms) {
  size_t most = 0;
  for (int32_t batch = 1; batch <= max_batch; ++batch) {
    const DecodePlan plan =
        PlanDecodeVariant(batch, num_kv_heads, head_dim, max_context_len, num_sms,
                          DefaultDecodeVariant(batch, num_kv_heads, head_dim, num_sms));
    most = std::max(most, DecodeWorkspaceBytes(plan, batch, num_q_heads, head_dim));
  }
  return most;
}

absl::Status LaunchPagedDecodeAttention(const PagedDecodeArgs& args, const DecodePlan& plan,
                                        void* workspace, size_t workspace_bytes,
                                        cudaStream_t stream) {
  if (absl::Status status = ValidateArgs(args, plan); !status.ok()) return status;
  internal::DecodeKernelParams p;
  const size_t needed = DecodeWorkspaceBytes(plan, args.batch, args.num_q_heads, args.head_dim);
  if (needed > 0 && args.batch > 0) {
    if (workspace == nullptr || workspace_bytes < needed || !Aligned(workspace, 16)) {
      return Invalid(absl::StrCat(
          "workspace (", workspace_bytes, " bytes", workspace == nullptr ? ", null" : "",
          ") must be 16-byte aligned and hold DecodeWorkspaceBytes = ", needed, " bytes for ",
          plan.num_splits, " splits"));
    }
    const size_t rows = static_cast<size_t>(args.batch) * args.num_q_heads * plan.num_splits;
    p.partial_out = static_cast<float*>(workspace);
    p.partial_stats = p.partial_out + rows * args.head_dim;
  }
  if (args.batch == 0) return absl::OkStatus();
  p.q = args.q;
  p.q_stride = args.q_stride;
  p.out = args.out;
  p.out_stride = args.out_stride;
  p.kv = args.kv_base;
  p.fp8 = args.kv_dtype == DecodeKvDtype::kFp8E4M3;
  p.block_stride = args.block_stride_elems;
  p.value_offset = args.value_offset_elems;
  p.scale_offset = args.scale_offset_elems;
  p.block_size = args.block_size;
  p.num_q_heads = args.num_q_heads;
  p.num_kv_heads = args.num_kv_heads;
  p.group = args.num_q_heads / args.num_kv_heads;
  p.head_dim = args.head_dim;
  p.block_tables = args.block_tables;
  p.max_blocks_per_seq = args.max_blocks_per_seq;
  p.context_lens = args.context_lens;
  p.batch = args.batch;
  p.num_splits = plan.num_splits;
  p.scale_log2 = args.scale * 1.4426950408889634f;
  p.variant = plan.variant;
  // The FP8 kernels merge in no cluster; with no workspace they take one split.
  if (p.fp8 && ClusterMerge(plan)) p.num_splits = 1;
  p.pdl = args.pdl;
  p.stable_prefix = args.pdl && args.stable_prefix;
  p.sm90 = CurrentDeviceIsSm90();
  const cudaError_t error = internal::PagedDecode(p, stream);
  if (error != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("paged_decode_attention launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

}  // namespace trident::kernels::cuda
