#ifndef TRIDENT_KERNELS_CUDA_ROPE_ROPE_H_
#define TRIDENT_KERNELS_CUDA_ROPE_ROPE_H_

// Rotary position embeddings on the GPU, in place on bf16 q and k heads, with
// the semantics of kernels/cpu/rope ApplyRope (the reference): HF's
// rotate_half convention, element i of a head paired with element
// i + head_dim / 2,
//
//   f = float(position) * inv_freq[i]                       (fp32)
//   x'[i]       = x[i] * cos(f) - x[i + d/2] * sin(f)
//   x'[i + d/2] = x[i + d/2] * cos(f) + x[i] * sin(f)
//
// with each product rounded on its own (no fused multiply-add), cos and sin
// from CUDA's accurate sincosf (not the __sincosf intrinsic) of the exact fp32
// angle, and the results rounded to bf16 (nearest even).
//
// inv_freq comes from kernels/cpu/rope RopeInvFreq on the host (HF's default
// and Llama 3 scaled frequencies), copied to the device once at load.
//
// Layout: a fused qkv buffer as the CPU backend uses it, row t of which holds
// [q heads | k heads | v heads]: pass q = qkv, k = qkv + num_q_heads *
// head_dim and both token strides = the row width. v is not touched. One
// thread block per token. The kernel takes raw device pointers and a stream,
// never allocates and never synchronizes.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/kv_append/kv_append.h"

namespace trident::kernels::cuda {

struct RopeArgs {
  // Device pointer: head h (< num_q_heads) of token t is the head_dim bf16
  // values at q + t * q_token_stride + h * head_dim (elements).
  void* q = nullptr;
  int64_t q_token_stride = 0;
  int32_t num_q_heads = 0;
  // Likewise for k; may be null when num_kv_heads == 0.
  void* k = nullptr;
  int64_t k_token_stride = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  // Device pointer to num_tokens positions, each in [0, 2^24) (exact as
  // float; not checked: they live on the device).
  const int32_t* positions = nullptr;
  int64_t num_tokens = 0;
  // Device pointer to head_dim / 2 fp32 inverse frequencies (RopeInvFreq).
  const float* inv_freq = nullptr;
};

// Enqueues the rotation on `stream`. kInvalidArgument naming the field for
// head_dim not positive and even or above 1024, negative head counts or
// num_tokens, token strides smaller than the heads they hold, q heads
// overlapping k heads of the same token, or null pointers with work to do;
// kInternal if the launch fails. Zero tokens is a no-op. Pairs of elements
// move as 4-byte bf16x2 when head_dim is a multiple of 4, strides are even
// and q and k are 4-byte aligned; as single elements otherwise.
absl::Status LaunchRope(const RopeArgs& args, cudaStream_t stream);

// The fused-qkv form for an fp32 projection: reads rows of
// [q heads | k heads | v heads] in fp32, rotates the q and k heads as above,
// and writes the whole row to `out` in bf16, so every value is rounded once,
// after the rotation (the v heads are only rounded).
struct RopeQkvArgs {
  // Device pointer to num_tokens rows of (num_q_heads + 2 * num_kv_heads) *
  // head_dim fp32 values, row stride in_stride elements.
  const float* in = nullptr;
  int64_t in_stride = 0;
  // Device pointer to the bf16 rows out, row stride out_stride elements. Must
  // not overlap `in`.
  void* out = nullptr;
  int64_t out_stride = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  const int32_t* positions = nullptr;
  int64_t num_tokens = 0;
  const float* inv_freq = nullptr;
  // Launch with programmatic dependent launch (kernels/cuda/pdl): scheduled
  // before the kernel ahead of it ends, waiting for it before any load.
  bool pdl = false;
  // Optional (kv.base null: not stored): each token's k (rotated) and v, as
  // written to `out`, also stored at slots[t] (device) of this layer's bf16
  // paged KV cache, where kernels/cuda/kv_append's LaunchKvAppend stores
  // them (a slot outside the cache: not stored), so the append launches no
  // kernel of its own. kv's heads and head_dim are the ones above.
  PagedKvBf16 kv;
  const int64_t* slots = nullptr;
};

// kInvalidArgument naming the field for the same shape errors as LaunchRope,
// strides smaller than a row, and a cache that ValidatePagedKvBf16 refuses,
// whose heads or head_dim differ, or without slots; kInternal if the launch
// fails.
absl::Status LaunchRopeQkv(const RopeQkvArgs& args, cudaStream_t stream);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_ROPE_ROPE_H_
