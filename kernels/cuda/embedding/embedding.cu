#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/embedding/embedding_kernel.h"

namespace trident::kernels::cuda::internal {
namespace {

// One block per token, copying the row in units of T (uint4: 8 bf16 values;
// uint16_t: one). Ids outside [0, vocab) give a zero row and no table read.
template <typename T>
__global__ void EmbeddingKernel(const int32_t* __restrict__ token_ids, const T* __restrict__ table,
                                int64_t vocab, int64_t row_units, T* __restrict__ out) {
  const int64_t token = blockIdx.x;
  const int32_t id = token_ids[token];
  T* dst = out + token * row_units;
  if (id < 0 || id >= vocab) {
    for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x) dst[i] = T{};
    return;
  }
  const T* src = table + static_cast<int64_t>(id) * row_units;
  for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x) dst[i] = src[i];
}

int ThreadsFor(int64_t units) {
  if (units >= 512) return 512;
  return static_cast<int>((units + 31) / 32 * 32);
}

}  // namespace

cudaError_t EmbeddingBf16(const int32_t* token_ids, int64_t num_tokens, const void* table,
                          int64_t vocab, int64_t hidden, void* out, bool vectorized,
                          cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(num_tokens);
  if (vectorized) {
    const int64_t units = hidden / 8;
    EmbeddingKernel<uint4><<<blocks, ThreadsFor(units), 0, stream>>>(
        token_ids, static_cast<const uint4*>(table), vocab, units, static_cast<uint4*>(out));
  } else {
    EmbeddingKernel<uint16_t><<<blocks, ThreadsFor(hidden), 0, stream>>>(
        token_ids, static_cast<const uint16_t*>(table), vocab, hidden, static_cast<uint16_t*>(out));
  }
  return cudaGetLastError();
}

}  // namespace trident::kernels::cuda::internal
