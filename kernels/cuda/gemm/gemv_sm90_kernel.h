#ifndef TRIDENT_KERNELS_CUDA_GEMM_GEMV_SM90_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_GEMM_GEMV_SM90_KERNEL_H_

// Hopper's single-row launcher (built for sm_90a alone); gemm.cc checks the
// arguments, that the shape suits a GEMV and that the device is sm_90.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/kv_append/kv_slot.h"

namespace trident::kernels::cuda::internal {

// An RMSNorm fused ahead of the product (weight null: none). x is then the
// f32 row [k] (k a multiple of 8, at most GemvBulkNormMaxK()) and each CTA
// multiplies by bf16(weight * (x * r)), r = 1 / sqrt(mean(x²) + eps), held
// in its shared memory: the bits kernels/cuda/rms_norm writes.
struct GemvNorm {
  const float* weight = nullptr;
  float eps = 0;
};

// RoPE in the epilogue (GemvRopeBulk): y is one token's q, k and v, and
// its first rope_heads heads of head_dim (a multiple of 8) are rotated at
// positions[0] with inv_freq [head_dim / 2], as kernels/cuda/rope does.
// With kv's cache, k (rotated; heads q_heads.. of the rope heads) and v
// are also stored at kv.slots[0] of that bf16 paged KV cache, where
// kernels/cuda/kv_append stores them, unless the slot is outside it.
struct GemvRope {
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int32_t head_dim = 0;
  int32_t rope_heads = 0;
  int32_t q_heads = 0;
  KvSlotTarget kv;
};

// How a launch hands out its work. Dynamic items: with `counter` (device,
// two words, zero before the launch, used by no other launch that may run
// at the same time; the kernel leaves them zero), the CTAs claim W's items
// of 8 rows one at a time instead of each taking a contiguous run, so CTAs
// that start late or read slowly take fewer and the grid ends together.
// Null: each CTA takes its contiguous run.
struct GemvSchedule {
  uint32_t* counter = nullptr;
};

// The longest row a fused norm takes (its bf16 copy beside the ring, two
// CTAs still fitting an SM).
int64_t GemvBulkNormMaxK();

// y[n] (+)= x[k] · Wᵀ (+ bias) for one row x, as GemvBf16 (gemv_kernel.h),
// for any k (a multiple of 8): W streams through shared memory by the bulk
// copy engine, two CTAs per SM at most (`sms`: the device's count, which
// the caller queries once). With `pdl` the kernel is launched with
// programmatic dependent launch and fills its pipeline before waiting for
// the kernel ahead. cudaErrorInvalidValue for sms <= 0.
cudaError_t GemvBf16Bulk(const void* x, const void* w, const void* bias, void* y, int64_t n,
                         int64_t k, bool f32_out, bool accumulate, int sms, bool pdl,
                         cudaStream_t stream, const GemvNorm& norm = {},
                         const GemvSchedule& schedule = {});

// y[j] = silu(g_j) * u_j in bf16 for j < n, where g = x · W[0, n)ᵀ and
// u = x · W[n, 2n)ᵀ (+ the f32 bias [2n] on both, when given): the same
// kernel with the SiLU-and-multiply as its epilogue.
cudaError_t GemvSiluMulBulk(const void* x, const void* w, const void* bias, void* y, int64_t n,
                            int64_t k, int sms, bool pdl, cudaStream_t stream,
                            const GemvNorm& norm = {}, const GemvSchedule& schedule = {});

// y [n] in bf16 = x · Wᵀ (+ the f32 bias [n]) for one token's fused
// q/k/v projection, its first rope.rope_heads heads rotated (GemvRope):
// the bits of the f32 GEMV followed by kernels/cuda/rope's RopeQkvF32.
// slots is read before the wait on the kernel ahead (with `pdl`): no kernel
// still running may write it. cudaErrorInvalidValue for a head_dim that is
// not a positive multiple of 8, rotated heads past n, or null positions or
// inv_freq.
cudaError_t GemvRopeBulk(const void* x, const void* w, const void* bias, void* y, int64_t n,
                         int64_t k, int sms, bool pdl, cudaStream_t stream, const GemvNorm& norm,
                         const GemvRope& rope, const GemvSchedule& schedule = {});

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_GEMM_GEMV_SM90_KERNEL_H_
