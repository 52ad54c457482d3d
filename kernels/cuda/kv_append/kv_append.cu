#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kv_append/kv_append_kernel.h"

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
  const int64_t token = blockIdx.x;
  const int64_t slot = slots[token];
  if (slot < 0 || slot >= capacity_slots) return;  // Padding, or a bad slot: write nothing.
  const int64_t block_start = (slot / block_size) * block_stride_units;
  const int64_t offset = slot % block_size;
  const int64_t row_units = static_cast<int64_t>(num_kv_heads) * head_units;
  for (int64_t u = threadIdx.x; u < 2 * row_units; u += blockDim.x) {
    const bool is_v = u >= row_units;
    const int64_t e = is_v ? u - row_units : u;
    const int64_t h = e / head_units;
    const int64_t d = e % head_units;
    const int64_t dst =
        block_start + (is_v ? value_offset_units : 0) + (h * block_size + offset) * head_units + d;
    base[dst] = is_v ? v[token * v_stride_units + e] : k[token * k_stride_units + e];
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
                         const int64_t* slots, int64_t num_tokens, bool vectorized,
                         cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  const int64_t capacity = num_blocks * block_size;
  const unsigned blocks = static_cast<unsigned>(num_tokens);
  if (vectorized) {
    const int32_t head_units = head_dim / 8;
    KvAppendKernel<uint4><<<blocks, ThreadsFor(2 * num_kv_heads * head_units), 0, stream>>>(
        static_cast<uint4*>(base), capacity, block_size, num_kv_heads, head_units,
        block_stride_elems / 8, value_offset_elems / 8, static_cast<const uint4*>(k), k_stride / 8,
        static_cast<const uint4*>(v), v_stride / 8, slots);
  } else {
    KvAppendKernel<uint16_t><<<blocks, ThreadsFor(2 * num_kv_heads * head_dim), 0, stream>>>(
        static_cast<uint16_t*>(base), capacity, block_size, num_kv_heads, head_dim,
        block_stride_elems, value_offset_elems, static_cast<const uint16_t*>(k), k_stride,
        static_cast<const uint16_t*>(v), v_stride, slots);
  }
  return cudaGetLastError();
}

}  // namespace trident::kernels::cuda::internal
