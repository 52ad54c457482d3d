#include "kernels/cuda/kv_append/kv_append.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/paged_kv_fp8/paged_kv_fp8.h"
#include "kernels/cuda/kv_append/kv_append_kernel.h"

namespace trident::kernels::cuda {

absl::Status ValidatePagedKvBf16(const PagedKvBf16& kv) {
  if (kv.base == nullptr) return absl::InvalidArgumentError("PagedKvBf16: base is null");
  if (kv.num_blocks <= 0 || kv.block_size <= 0 || kv.num_kv_heads <= 0 || kv.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedKvBf16: num_blocks ", kv.num_blocks, ", block_size ", kv.block_size,
        ", num_kv_heads ", kv.num_kv_heads, " and head_dim ", kv.head_dim, " must be positive"));
  }
  const int64_t half = static_cast<int64_t>(kv.num_kv_heads) * kv.block_size * kv.head_dim;
  if (kv.value_offset_elems < half) {
    return absl::InvalidArgumentError(absl::StrCat("PagedKvBf16: value_offset_elems ",
                                                   kv.value_offset_elems, " is less than the ",
                                                   half, " elements of a block's keys"));
  }
  if (kv.block_stride_elems < kv.value_offset_elems + half) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PagedKvBf16: block_stride_elems ", kv.block_stride_elems,
        " is less than value_offset_elems + the ", half, " elements of a block's values"));
  }
  return absl::OkStatus();
}

absl::Status ValidateKvStore(const PagedKvBf16& kv, const int64_t* slots, int32_t num_kv_heads,
                             int32_t head_dim) {
  if (absl::Status s = ValidatePagedKvBf16(kv); !s.ok()) return s;
  if (kv.num_kv_heads != num_kv_heads || kv.head_dim != head_dim || slots == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(kv.num_kv_heads, " heads of ", kv.head_dim,
                                                   " must be the step's ", num_kv_heads, " of ",
                                                   head_dim, ", with slots"));
  }
  return absl::OkStatus();
}

namespace {

// The checks both appends share: the token count, row strides and pointers.
absl::Status CheckRows(int64_t num_tokens, int64_t row, int64_t k_stride, int64_t v_stride,
                       const void* k, const void* v, const int64_t* slots) {
  if (num_tokens < 0 || num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_append: num_tokens is ", num_tokens, "; want 0 <= num_tokens < 2^31"));
  }
  if (k_stride < row || v_stride < row) {
    return absl::InvalidArgumentError(absl::StrCat("kv_append: k_stride ", k_stride,
                                                   " and v_stride ", v_stride,
                                                   " must hold a row of ", row, " elements"));
  }
  if (num_tokens > 0 && (k == nullptr || v == nullptr || slots == nullptr)) {
    return absl::InvalidArgumentError("kv_append: null k, v or slots with tokens to store");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidatePagedKvFp8Gpu(const PagedKvFp8Gpu& kv) {
  if (kv.num_blocks <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedKvFp8Gpu: num_blocks ", kv.num_blocks, " must be positive"));
  }
  if (kv.head_dim > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedKvFp8Gpu: head_dim ", kv.head_dim, " is above 256"));
  }
  // The layout's own rules (heads, multiples of 16, alignment, K, V and the
  // scales inside the block and apart).
  return cpu::ValidatePagedKvFp8(cpu::PagedKvFp8{.base = kv.base,
                                                 .block_size = kv.block_size,
                                                 .num_kv_heads = kv.num_kv_heads,
                                                 .head_dim = kv.head_dim,
                                                 .block_stride_bytes = kv.block_stride_bytes,
                                                 .value_offset_bytes = kv.value_offset_bytes,
                                                 .scale_offset_bytes = kv.scale_offset_bytes});
}

absl::Status LaunchKvAppendFp8(const KvAppendFp8Args& args, cudaStream_t stream) {
  if (absl::Status s = ValidatePagedKvFp8Gpu(args.kv); !s.ok()) return s;
  const PagedKvFp8Gpu& kv = args.kv;
  if (absl::Status s =
          CheckRows(args.num_tokens, static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim,
                    args.k_stride, args.v_stride, args.k, args.v, args.slots);
      !s.ok()) {
    return s;
  }
  const cudaError_t error = internal::KvAppendFp8(
      kv.base, kv.num_blocks, kv.block_size, kv.num_kv_heads, kv.head_dim, kv.block_stride_bytes,
      kv.value_offset_bytes, kv.scale_offset_bytes, args.k, args.k_stride, args.v, args.v_stride,
      args.slots, args.num_tokens, args.pdl, stream);
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("kv_append fp8 launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

absl::Status LaunchKvAppend(const KvAppendArgs& args, cudaStream_t stream) {
  if (absl::Status s = ValidatePagedKvBf16(args.kv); !s.ok()) return s;
  if (absl::Status s =
          CheckRows(args.num_tokens, static_cast<int64_t>(args.kv.num_kv_heads) * args.kv.head_dim,
                    args.k_stride, args.v_stride, args.k, args.v, args.slots);
      !s.ok()) {
    return s;
  }
  const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vectorized = args.kv.head_dim % 8 == 0 && args.k_stride % 8 == 0 &&
                          args.v_stride % 8 == 0 && args.kv.block_stride_elems % 8 == 0 &&
                          args.kv.value_offset_elems % 8 == 0 && aligned16(args.kv.base) &&
                          aligned16(args.k) && aligned16(args.v);
  const PagedKvBf16& kv = args.kv;
  const cudaError_t error = internal::KvAppendBf16(
      kv.base, kv.num_blocks, kv.block_size, kv.num_kv_heads, kv.head_dim, kv.block_stride_elems,
      kv.value_offset_elems, args.k, args.k_stride, args.v, args.v_stride, args.slots,
      args.num_tokens, vectorized, args.pdl, stream);
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("kv_append launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

}  // namespace trident::kernels::cuda
