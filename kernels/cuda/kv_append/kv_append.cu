#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/numeric/fp8_fragment.h"
#include "kernels/cuda/kv_append/kv_append_kernel.h"
#include "kernels/cuda/kv_append/kv_slot.h"
#include "kernels/cuda/pdl/pdl_device.h"

namespace trident::kernels::cuda::internal {
namespace {

// One block per token. T is the copy unit (uint4: 8 bf16 values; uint16_t:
// one); every offset and stride below counts units. Threads walk the token's
// K units, then its V units.
template <typename T>
__global__ void KvAppendKernel(T* __restrict__ base, int64_t capacity_slots, int32_t block_size,
                               int32_t num_kv_heads, int32_t head_units, int64_t block_stride_units,
                               int64_t value_offset_units, const T* __restrict__ k,
                               int64_t k_stride_units, const T* __restrict__ v,
                               int64_t v_stride_units, const int64_t* __restrict__ slots) {
  // Launched with programmatic dependent launch, wait for the kernel ahead
  // (RoPE writes k) before the first load.
  pdl::LetDependentsLaunchThenWait();
  const int64_t token = blockIdx.x;
  // In units: the slot's place (padding, or a bad slot: write nothing).
  const KvSlot place = KvSlotOf(slots[token], capacity_slots, block_size, block_stride_units,
                                value_offset_units, head_units);
  if (!place.stored()) return;
  const int64_t row_units = static_cast<int64_t>(num_kv_heads) * head_units;
  for (int64_t u = threadIdx.x; u < 2 * row_units; u += blockDim.x) {
    const bool is_v = u >= row_units;
    const int64_t e = is_v ? u - row_units : u;
    base[place.At(is_v, e / head_units, e % head_units)] =
        is_v ? v[token * v_stride_units + e] : k[token * k_stride_units + e];
  }
}

constexpr int kFp8Warps = 8;

// One CTA per token, one warp per (kind, kv head) row at a time: the row's
// amax by shuffles, its scale, then each lane's elements d = lane + 32 j.
__global__ void __launch_bounds__(kFp8Warps * 32)
    KvAppendFp8Kernel(unsigned char* __restrict__ base, int64_t capacity_slots, int32_t block_size,
                      int32_t num_kv_heads, int32_t head_dim, int64_t block_stride,
                      int64_t value_offset, int64_t scale_offset,
                      const __nv_bfloat16* __restrict__ k, int64_t k_stride,
                      const __nv_bfloat16* __restrict__ v, int64_t v_stride,
                      const int64_t* __restrict__ slots) {
  pdl::LetDependentsLaunchThenWait();  // As KvAppendKernel.
  const int64_t token = blockIdx.x;
  const int64_t slot = slots[token];
  if (slot < 0 || slot >= capacity_slots) return;
  unsigned char* block = base + (slot / block_size) * block_stride;
  const int offset = static_cast<int>(slot % block_size);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  for (int r = warp; r < 2 * num_kv_heads; r += kFp8Warps) {
    const int which = r / num_kv_heads;  // 0: K, 1: V.
    const int h = r % num_kv_heads;
    const __nv_bfloat16* row =
        (which == 0 ? k + token * k_stride : v + token * v_stride) + h * head_dim;
    float x[8];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int d = lane + 32 * j;
      x[j] = d < head_dim ? __bfloat162float(row[d]) : 0.0f;
      amax = fmaxf(amax, fabsf(x[j]));  // fmaxf drops a NaN.
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(~0u, amax, o));
    const float scale = amax == 0.0f || isinf(amax) ? 1.0f : amax / 448.0f;
    if (lane == 0) {
      *reinterpret_cast<float*>(
          block + scale_offset +
          ((static_cast<int64_t>(which) * num_kv_heads + h) * block_size + offset) * 4) = scale;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int d = lane + 32 * j;
      if (d >= head_dim) break;
      const unsigned char byte = static_cast<unsigned char>(
          __nv_cvt_float_to_fp8(__fdiv_rn(x[j], scale), __NV_SATFINITE, __NV_E4M3));
      int64_t at;
      if (which == 0) {
        at = (static_cast<int64_t>(h) * block_size + offset) * head_dim + d / 16 * 16 +
             numeric::Fp8FragmentPosition(d % 16);
      } else {
        const int64_t group = static_cast<int64_t>(h) * (block_size / 16) + offset / 16;
        at = value_offset + (group * head_dim + d) * 16 + numeric::Fp8FragmentPosition(offset % 16);
      }
      block[at] = byte;
    }
  }
}

int ThreadsFor(int64_t units) {
  if (units >= 256) return 256;
  return static_cast<int>((units + 31) / 32 * 32);
}

}  // namespace

cudaError_t KvAppendBf16(void* base, int64_t num_blocks, int32_t block_size, int32_t num_kv_heads,
                         int32_t head_dim, int64_t block_stride_elems, int64_t value_offset_elems,
                         const void* k, int64_t k_stride, const void* v, int64_t v_stride,
                         const int64_t* slots, int64_t num_tokens, bool vectorized, bool pdl,
                         cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  const int64_t capacity = num_blocks * block_size;
  const dim3 blocks(static_cast<unsigned>(num_tokens));
  if (vectorized) {
    const int32_t head_units = head_dim / 8;
    return pdl::Launch(&KvAppendKernel<uint4>, blocks,
                       dim3(ThreadsFor(2 * num_kv_heads * head_units)), 0, stream, pdl,
                       static_cast<uint4*>(base), capacity, block_size, num_kv_heads, head_units,
                       block_stride_elems / 8, value_offset_elems / 8, static_cast<const uint4*>(k),
                       k_stride / 8, static_cast<const uint4*>(v), v_stride / 8, slots);
  }
  return pdl::Launch(&KvAppendKernel<uint16_t>, blocks,
                     dim3(ThreadsFor(2 * num_kv_heads * head_dim)), 0, stream, pdl,
                     static_cast<uint16_t*>(base), capacity, block_size, num_kv_heads, head_dim,
                     block_stride_elems, value_offset_elems, static_cast<const uint16_t*>(k),
                     k_stride, static_cast<const uint16_t*>(v), v_stride, slots);
}

cudaError_t KvAppendFp8(void* base, int64_t num_blocks, int32_t block_size, int32_t num_kv_heads,
                        int32_t head_dim, int64_t block_stride_bytes, int64_t value_offset_bytes,
                        int64_t scale_offset_bytes, const void* k, int64_t k_stride, const void* v,
                        int64_t v_stride, const int64_t* slots, int64_t num_tokens, bool pdl,
                        cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  const int warps = 2 * num_kv_heads < kFp8Warps ? 2 * num_kv_heads : kFp8Warps;
  return pdl::Launch(&KvAppendFp8Kernel, dim3(static_cast<unsigned>(num_tokens)), dim3(warps * 32),
                     0, stream, pdl, static_cast<unsigned char*>(base), num_blocks * block_size,
                     block_size, num_kv_heads, head_dim, block_stride_bytes, value_offset_bytes,
                     scale_offset_bytes, static_cast<const __nv_bfloat16*>(k), k_stride,
                     static_cast<const __nv_bfloat16*>(v), v_stride, slots);
}

}  // namespace trident::kernels::cuda::internal
