#include "kernels/cuda/rope/rope.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/rope/rope_kernel.h"

namespace trident::kernels::cuda {

absl::Status LaunchRope(const RopeArgs& args, cudaStream_t stream) {
  if (args.head_dim <= 0 || args.head_dim % 2 != 0 || args.head_dim > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope: head_dim is ", args.head_dim, "; want a positive even number <= 1024"));
  }
  if (args.num_q_heads < 0 || args.num_kv_heads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("rope: num_q_heads ", args.num_q_heads,
                                                   " and num_kv_heads ", args.num_kv_heads,
                                                   " must be >= 0"));
  }
  if (args.num_tokens < 0 || args.num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope: num_tokens is ", args.num_tokens, "; want 0 <= num_tokens < 2^31"));
  }
  const int64_t q_width = static_cast<int64_t>(args.num_q_heads) * args.head_dim;
  const int64_t k_width = static_cast<int64_t>(args.num_kv_heads) * args.head_dim;
  if (args.num_q_heads > 0 && args.q_token_stride < q_width) {
    return absl::InvalidArgumentError(absl::StrCat("rope: q_token_stride is ", args.q_token_stride,
                                                   "; want >= ", q_width,
                                                   " (num_q_heads * head_dim)"));
  }
  if (args.num_kv_heads > 0 && args.k_token_stride < k_width) {
    return absl::InvalidArgumentError(absl::StrCat("rope: k_token_stride is ", args.k_token_stride,
                                                   "; want >= ", k_width,
                                                   " (num_kv_heads * head_dim)"));
  }
  const bool work = args.num_tokens > 0 && args.num_q_heads + args.num_kv_heads > 0;
  if (work && (args.positions == nullptr || args.inv_freq == nullptr ||
               (args.num_q_heads > 0 && args.q == nullptr) ||
               (args.num_kv_heads > 0 && args.k == nullptr))) {
    return absl::InvalidArgumentError(
        "rope: null q, k, positions or inv_freq with heads to rotate");
  }
  if (work && args.num_q_heads > 0 && args.num_kv_heads > 0) {
    // Token 0's q heads and k heads must not share elements (they would be
    // rotated twice).
    const uintptr_t q0 = reinterpret_cast<uintptr_t>(args.q);
    const uintptr_t k0 = reinterpret_cast<uintptr_t>(args.k);
    if (q0 < k0 + 2 * static_cast<uintptr_t>(k_width) &&
        k0 < q0 + 2 * static_cast<uintptr_t>(q_width)) {
      return absl::InvalidArgumentError("rope: q heads and k heads overlap");
    }
  }
  const bool paired =
      args.head_dim % 4 == 0 && args.q_token_stride % 2 == 0 && args.k_token_stride % 2 == 0 &&
      reinterpret_cast<uintptr_t>(args.q) % 4 == 0 && reinterpret_cast<uintptr_t>(args.k) % 4 == 0;
  const cudaError_t error = internal::RopeBf16(
      args.q, args.q_token_stride, args.num_q_heads, args.k, args.k_token_stride, args.num_kv_heads,
      args.head_dim, args.positions, args.num_tokens, args.inv_freq, paired, stream);
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("rope launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

absl::Status LaunchRopeQkv(const RopeQkvArgs& args, cudaStream_t stream) {
  if (args.head_dim <= 0 || args.head_dim % 2 != 0 || args.head_dim > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("rope_qkv: head_dim is ", args.head_dim,
                                                   "; want a positive even number <= 1024"));
  }
  if (args.num_q_heads < 0 || args.num_kv_heads < 0 || args.num_q_heads + args.num_kv_heads == 0) {
    return absl::InvalidArgumentError(absl::StrCat("rope_qkv: num_q_heads ", args.num_q_heads,
                                                   " and num_kv_heads ", args.num_kv_heads,
                                                   " must be >= 0 and not both 0"));
  }
  if (args.num_tokens < 0 || args.num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_qkv: num_tokens is ", args.num_tokens, "; want 0 <= num_tokens < 2^31"));
  }
  const int64_t width =
      (static_cast<int64_t>(args.num_q_heads) + 2 * args.num_kv_heads) * args.head_dim;
  if (args.in_stride < width || args.out_stride < width) {
    return absl::InvalidArgumentError(absl::StrCat("rope_qkv: in_stride ", args.in_stride,
                                                   " and out_stride ", args.out_stride,
                                                   " must hold a row of ", width));
  }
  if (args.num_tokens > 0 && (args.in == nullptr || args.out == nullptr ||
                              args.positions == nullptr || args.inv_freq == nullptr)) {
    return absl::InvalidArgumentError("rope_qkv: null in, out, positions or inv_freq");
  }
  if (args.kv.base != nullptr) {
    if (absl::Status s = ValidateKvStore(args.kv, args.slots, args.num_kv_heads, args.head_dim);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("rope_qkv: KV cache: ", s.message()));
    }
  }
  const cudaError_t error =
      internal::RopeQkvF32(args.in, args.in_stride, args.out, args.out_stride, args.num_q_heads,
                           args.num_kv_heads, args.head_dim, args.positions, args.num_tokens,
                           args.inv_freq, args.pdl, SlotTargetOf(args.kv, args.slots), stream);
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("rope_qkv launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

}  // namespace trident::kernels::cuda
