#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kv_append/kv_slot.h"
#include "kernels/cuda/pdl/pdl_device.h"
#include "kernels/cuda/rope/rope_device.h"
#include "kernels/cuda/rope/rope_kernel.h"

namespace trident::kernels::cuda::internal {
namespace {

__device__ __forceinline__ float Bf16BitsToFloat(uint32_t bits) {
  return __uint_as_float(bits << 16);
}
__device__ __forceinline__ uint32_t FloatToBf16Bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

using rope::Rotate;

// One block per token. The token's cos/sin of its half angles go to shared
// memory first; then each thread rotates VEC (2 or 1) adjacent pairs
// (i, i + half) at a time across all q and k heads.
template <int VEC>
__global__ void RopeKernel(uint16_t* q, int64_t q_token_stride, int32_t num_q_heads, uint16_t* k,
                           int64_t k_token_stride, int32_t num_kv_heads, int32_t head_dim,
                           const int32_t* __restrict__ positions,
                           const float* __restrict__ inv_freq) {
  extern __shared__ float cos_sin[];  // cos[half], then sin[half].
  const int64_t token = blockIdx.x;
  const int32_t half = head_dim / 2;
  const float position = static_cast<float>(positions[token]);
  for (int32_t i = threadIdx.x; i < half; i += blockDim.x) {
    float s;
    float c;
    rope::CosSin(position, inv_freq[i], c, s);
    cos_sin[i] = c;
    cos_sin[half + i] = s;
  }
  __syncthreads();
  const int32_t units_per_head = half / VEC;
  const int64_t units = static_cast<int64_t>(num_q_heads + num_kv_heads) * units_per_head;
  for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
    const int32_t h = static_cast<int32_t>(u / units_per_head);
    const int32_t i = static_cast<int32_t>(u % units_per_head) * VEC;
    uint16_t* head =
        h < num_q_heads
            ? q + token * q_token_stride + static_cast<int64_t>(h) * head_dim
            : k + token * k_token_stride + static_cast<int64_t>(h - num_q_heads) * head_dim;
    if constexpr (VEC == 2) {
      uint32_t* lo = reinterpret_cast<uint32_t*>(head + i);
      uint32_t* hi = reinterpret_cast<uint32_t*>(head + half + i);
      const uint32_t a = *lo;
      const uint32_t b = *hi;
      float x0, y0, x1, y1;
      Rotate(Bf16BitsToFloat(a & 0xffffu), Bf16BitsToFloat(b & 0xffffu), cos_sin[i],
             cos_sin[half + i], x0, y0);
      Rotate(Bf16BitsToFloat(a >> 16), Bf16BitsToFloat(b >> 16), cos_sin[i + 1],
             cos_sin[half + i + 1], x1, y1);
      *lo = FloatToBf16Bits(x0) | (FloatToBf16Bits(x1) << 16);
      *hi = FloatToBf16Bits(y0) | (FloatToBf16Bits(y1) << 16);
    } else {
      float x, y;
      Rotate(Bf16BitsToFloat(head[i]), Bf16BitsToFloat(head[half + i]), cos_sin[i],
             cos_sin[half + i], x, y);
      head[i] = static_cast<uint16_t>(FloatToBf16Bits(x));
      head[half + i] = static_cast<uint16_t>(FloatToBf16Bits(y));
    }
  }
}

// Heads of a token one block of RopeQkvF32Kernel takes.
constexpr int32_t kQkvHeadsPerBlock = 4;

// One block per (token, kQkvHeadsPerBlock heads of its q, k and v heads in
// that order), so one token's row spreads over several SMs: a block with q
// or k heads computes the token's cos/sin first, then rotates their pairs
// (i, i + half); v heads are rounded to bf16 as they are. With a cache, k
// and v heads' values are stored there too.
__global__ void RopeQkvF32Kernel(const float* __restrict__ in, int64_t in_stride,
                                 uint16_t* __restrict__ out, int64_t out_stride,
                                 int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                                 const int32_t* __restrict__ positions,
                                 const float* __restrict__ inv_freq, KvSlotTarget store) {
  extern __shared__ float cos_sin[];  // cos[half], then sin[half].
  // Launched with programmatic dependent launch, wait for the projection
  // ahead (and let the kernel behind be scheduled).
  pdl::LetDependentsLaunchThenWait();
  const int64_t token = blockIdx.x;
  const int32_t half = head_dim / 2;
  const int32_t rope_heads = num_q_heads + num_kv_heads;
  const int32_t head0 = static_cast<int32_t>(blockIdx.y) * kQkvHeadsPerBlock;
  const int32_t head_end = min(head0 + kQkvHeadsPerBlock, rope_heads + num_kv_heads);
  const float* src = in + token * in_stride;
  uint16_t* dst = out + token * out_stride;
  uint16_t* const cache = static_cast<uint16_t*>(store.base);
  const KvSlot place = store.Of(token, head_dim);
  if (head0 < rope_heads) {  // The same for the whole block.
    const float position = static_cast<float>(positions[token]);
    for (int32_t i = threadIdx.x; i < half; i += blockDim.x) {
      float s;
      float c;
      rope::CosSin(position, inv_freq[i], c, s);
      cos_sin[i] = c;
      cos_sin[half + i] = s;
    }
    __syncthreads();
    const int32_t pairs = (min(head_end, rope_heads) - head0) * half;
    for (int32_t u = threadIdx.x; u < pairs; u += blockDim.x) {
      const int32_t i = u % half;
      const int64_t at = static_cast<int64_t>(head0 + u / half) * head_dim + i;
      float x, y;
      Rotate(src[at], src[at + half], cos_sin[i], cos_sin[half + i], x, y);
      const uint16_t lo = static_cast<uint16_t>(FloatToBf16Bits(x));
      const uint16_t hi = static_cast<uint16_t>(FloatToBf16Bits(y));
      dst[at] = lo;
      dst[at + half] = hi;
      const int32_t h = head0 + u / half;
      if (place.stored() && h >= num_q_heads) {
        cache[place.At(false, h - num_q_heads, i)] = lo;
        cache[place.At(false, h - num_q_heads, i + half)] = hi;
      }
    }
  }
  const int64_t v_begin = static_cast<int64_t>(max(head0, rope_heads)) * head_dim;
  const int64_t v_end = static_cast<int64_t>(head_end) * head_dim;
  for (int64_t e = v_begin + threadIdx.x; e < v_end; e += blockDim.x) {
    const uint16_t v = static_cast<uint16_t>(FloatToBf16Bits(src[e]));
    dst[e] = v;
    if (place.stored()) {
      const int64_t ve = e - static_cast<int64_t>(rope_heads) * head_dim;
      cache[place.At(true, ve / head_dim, ve % head_dim)] = v;
    }
  }
}

}  // namespace

cudaError_t RopeQkvF32(const float* in, int64_t in_stride, void* out, int64_t out_stride,
                       int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim,
                       const int32_t* positions, int64_t num_tokens, const float* inv_freq,
                       bool pdl, const KvSlotTarget& store, cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int32_t heads = num_q_heads + 2 * num_kv_heads;
  if (heads == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(num_tokens),
                  static_cast<unsigned>((heads + kQkvHeadsPerBlock - 1) / kQkvHeadsPerBlock));
  return pdl::Launch(&RopeQkvF32Kernel, grid, dim3(kThreads),
                     static_cast<size_t>(head_dim) * sizeof(float), stream, pdl, in, in_stride,
                     static_cast<uint16_t*>(out), out_stride, num_q_heads, num_kv_heads, head_dim,
                     positions, inv_freq, store);
}

cudaError_t RopeBf16(void* q, int64_t q_token_stride, int32_t num_q_heads, void* k,
                     int64_t k_token_stride, int32_t num_kv_heads, int32_t head_dim,
                     const int32_t* positions, int64_t num_tokens, const float* inv_freq,
                     bool paired, cudaStream_t stream) {
  if (num_tokens == 0 || num_q_heads + num_kv_heads == 0) return cudaSuccess;
  const int64_t units =
      static_cast<int64_t>(num_q_heads + num_kv_heads) * (head_dim / 2) / (paired ? 2 : 1);
  const int threads = units >= 256 ? 256 : static_cast<int>((units + 31) / 32 * 32);
  const size_t shared = static_cast<size_t>(head_dim) * sizeof(float);
  const unsigned blocks = static_cast<unsigned>(num_tokens);
  uint16_t* qb = static_cast<uint16_t*>(q);
  uint16_t* kb = static_cast<uint16_t*>(k);
  if (paired) {
    RopeKernel<2><<<blocks, threads, shared, stream>>>(qb, q_token_stride, num_q_heads, kb,
                                                       k_token_stride, num_kv_heads, head_dim,
                                                       positions, inv_freq);
  } else {
    RopeKernel<1><<<blocks, threads, shared, stream>>>(qb, q_token_stride, num_q_heads, kb,
                                                       k_token_stride, num_kv_heads, head_dim,
                                                       positions, inv_freq);
  }
  return cudaGetLastError();
}

}  // namespace trident::kernels::cuda::internal
