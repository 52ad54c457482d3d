#include "kernels/cuda/paged_prefill_attention/paged_prefill_attention.h"

#include <cmath>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cuda/arch/arch.h"
#include "kernels/cuda/paged_prefill_attention/paged_prefill_attention_kernel.h"

namespace trident::kernels::cuda {
namespace {

constexpr int64_t kGridLimitYz = 65535;

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

absl::Status Invalid(const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("paged_prefill_attention: ", message));
}

absl::Status Validate(const PagedPrefillArgs& a) {
  if (a.head_dim < 16 || a.head_dim > 256 || a.head_dim % 16 != 0) {
    return Invalid(absl::StrCat("head_dim ", a.head_dim, " must be a multiple of 16 in [16, 256]"));
  }
  if (a.block_size <= 0) return Invalid(absl::StrCat("block_size ", a.block_size, " must be > 0"));
  if (a.num_q_heads <= 0 || a.num_kv_heads <= 0 || a.num_q_heads % a.num_kv_heads != 0) {
    return Invalid(absl::StrCat("num_q_heads ", a.num_q_heads,
                                " must be a positive multiple of num_kv_heads ", a.num_kv_heads));
  }
  if (a.batch < 0 || a.batch > kGridLimitYz) {
    return Invalid(absl::StrCat("batch ", a.batch, " must be in [0, ", kGridLimitYz, "]"));
  }
  if (a.max_query_len < 0) {
    return Invalid(absl::StrCat("max_query_len ", a.max_query_len, " must be >= 0"));
  }
  // Query tiles are at least 64 rows and run along the grid's y dimension.
  if (a.max_query_len > kGridLimitYz * 64) {
    return Invalid(absl::StrCat("max_query_len ", a.max_query_len, " exceeds ", kGridLimitYz * 64));
  }
  if (a.max_blocks_per_seq < 0) {
    return Invalid(absl::StrCat("max_blocks_per_seq ", a.max_blocks_per_seq, " must be >= 0"));
  }
  if (static_cast<int64_t>(a.max_blocks_per_seq) * a.block_size > INT32_MAX) {
    return Invalid("max_blocks_per_seq * block_size exceeds 2^31 - 1 positions");
  }
  if (!(a.scale > 0.0f) || !std::isfinite(a.scale)) {
    return Invalid(absl::StrCat("scale ", a.scale, " must be finite and > 0"));
  }
  const int64_t row = static_cast<int64_t>(a.num_q_heads) * a.head_dim;
  if (a.q_stride < row || a.q_stride % 8 != 0) {
    return Invalid(absl::StrCat("q_stride ", a.q_stride, " must be a multiple of 8 and >= ", row));
  }
  if (a.out_stride < row || a.out_stride % 8 != 0) {
    return Invalid(
        absl::StrCat("out_stride ", a.out_stride, " must be a multiple of 8 and >= ", row));
  }
  // One block's K (and V) span; the kernel copies 16-byte chunks, so every
  // offset is a multiple of 16 bytes (8 bf16 elements).
  const int64_t unit = a.kv_fp8 ? 16 : 8;
  const int64_t half = static_cast<int64_t>(a.num_kv_heads) * a.block_size * a.head_dim;
  if (a.kv_fp8 && a.block_size % 16 != 0) {
    return Invalid(
        absl::StrCat("block_size ", a.block_size, " must be a multiple of 16 for an FP8 cache"));
  }
  if (a.value_offset_elems < half || a.value_offset_elems % unit != 0) {
    return Invalid(absl::StrCat("value_offset_elems ", a.value_offset_elems,
                                " must be a multiple of ", unit, " and >= one block's K (", half,
                                ")"));
  }
  // FP8: the scales (2 x heads x tokens x 4 bytes) after V.
  const int64_t scales = static_cast<int64_t>(2) * a.num_kv_heads * a.block_size * 4;
  if (a.kv_fp8 &&
      (a.scale_offset_elems < a.value_offset_elems + half || a.scale_offset_elems % unit != 0)) {
    return Invalid(absl::StrCat("scale_offset_elems ", a.scale_offset_elems,
                                " must be a multiple of 16 and >= value_offset_elems + ", half));
  }
  const int64_t block_end = a.kv_fp8 ? a.scale_offset_elems + scales : a.value_offset_elems + half;
  if (a.block_stride_elems < block_end || a.block_stride_elems % unit != 0) {
    return Invalid(absl::StrCat("block_stride_elems ", a.block_stride_elems,
                                " must be a multiple of ", unit, " and hold the block (", block_end,
                                ")"));
  }
  if (a.batch == 0 || a.max_query_len == 0) return absl::OkStatus();
  if (a.q == nullptr || a.out == nullptr || a.kv_base == nullptr || a.block_tables == nullptr ||
      a.context_lens == nullptr || a.query_lens == nullptr || a.query_starts == nullptr) {
    return Invalid(
        "null pointer (q, out, kv_base, block_tables, context_lens, query_lens or "
        "query_starts) with work to do");
  }
  if (!Aligned16(a.q) || !Aligned16(a.out) || !Aligned16(a.kv_base)) {
    return Invalid("q, out and kv_base must be 16-byte aligned");
  }
  if (a.max_blocks_per_seq == 0) return Invalid("max_blocks_per_seq is 0 with work to do");
  return absl::OkStatus();
}

// Whether `kernel` (kAuto: wherever it applies) takes Hopper's wgmma kernel;
// kInvalidArgument or kFailedPrecondition when kWgmma is asked for where it
// does not apply.
absl::StatusOr<bool> UseHopperKernel(PrefillKernel kernel,
                                     const internal::PagedPrefillParams& params) {
  if (kernel == PrefillKernel::kMmaSync) return false;
  const bool supported = internal::PagedPrefillSm90Supports(params);
  if (kernel == PrefillKernel::kWgmma && !supported) {
    return Invalid(absl::StrCat(
        "the wgmma kernel takes head_dim 128 (and an FP8 cache only in blocks of at most 128 "
        "tokens, 128-byte aligned), not head_dim ",
        params.head_dim, params.kv_fp8 ? " and this FP8 cache" : ""));
  }
  if (!supported) return false;
  const bool sm90 = CurrentDeviceIsSm90();
  if (kernel == PrefillKernel::kWgmma && !sm90) {
    return absl::FailedPreconditionError(
        "paged_prefill_attention: the wgmma kernel needs an sm_90 device");
  }
  return sm90;
}

}  // namespace

absl::Status LaunchPagedPrefillAttention(const PagedPrefillArgs& args, cudaStream_t stream) {
  if (absl::Status status = Validate(args); !status.ok()) return status;
  if (args.batch == 0 || args.max_query_len == 0) return absl::OkStatus();
  const internal::PagedPrefillParams params{
      .q = args.q,
      .q_stride = args.q_stride,
      .out = args.out,
      .out_stride = args.out_stride,
      .kv_base = args.kv_base,
      .kv_fp8 = args.kv_fp8,
      .block_stride_elems = args.block_stride_elems,
      .value_offset_elems = args.value_offset_elems,
      .scale_offset_elems = args.scale_offset_elems,
      .block_size = args.block_size,
      .num_q_heads = args.num_q_heads,
      .num_kv_heads = args.num_kv_heads,
      .head_dim = args.head_dim,
      .block_tables = args.block_tables,
      .max_blocks_per_seq = args.max_blocks_per_seq,
      .context_lens = args.context_lens,
      .query_lens = args.query_lens,
      .query_starts = args.query_starts,
      .batch = args.batch,
      .max_query_len = args.max_query_len,
      .scale = args.scale,
  };
  const absl::StatusOr<bool> hopper = UseHopperKernel(args.kernel, params);
  if (!hopper.ok()) return hopper.status();
  const cudaError_t error = *hopper ? internal::PagedPrefillAttentionSm90(params, stream)
                                    : internal::PagedPrefillAttention(params, stream);
  if (error != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("paged_prefill_attention launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

}  // namespace trident::kernels::cuda
