#include <cstdint>

#include "kernels/cuda/block_copy/block_copy_kernel.h"

namespace trident::kernels::cuda::internal {
namespace {

constexpr int kThreads = 256;
// 16-byte words per thread per pass, all loaded before any is stored: a
// CTA keeps 16 KiB in flight, which a peer's link latency needs.
constexpr int kUnroll = 4;
constexpr int64_t kChunkWords = int64_t{kThreads} * kUnroll;

// Grid: x over blocks, y over 16 KiB chunks of a block.
__global__ void __launch_bounds__(kThreads)
    BlockCopyKernel(const void* const* __restrict__ src, void* const* __restrict__ dst,
                    int64_t block_words) {
  const int64_t block = blockIdx.x;
  const uint4* from = static_cast<const uint4*>(src[block]);
  uint4* to = static_cast<uint4*>(dst[block]);
  for (int64_t base = blockIdx.y * kChunkWords; base < block_words;
       base += int64_t{gridDim.y} * kChunkWords) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads + threadIdx.x;
      if (i < block_words) v[u] = from[i];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads + threadIdx.x;
      if (i < block_words) to[i] = v[u];
    }
  }
}

}  // namespace

cudaError_t BlockCopy(const void* const* src, void* const* dst, int64_t num_blocks,
                      int64_t block_bytes, cudaStream_t stream) {
  const int64_t words = block_bytes / 16;
  const int64_t chunks = (words + kChunkWords - 1) / kChunkWords;
  // Up to 16 CTAs a block; longer blocks loop.
  const unsigned y = static_cast<unsigned>(chunks < 16 ? chunks : 16);
  // gridDim.x is at most 2^31 - 1; callers pass far fewer blocks.
  BlockCopyKernel<<<dim3(static_cast<unsigned>(num_blocks), y), kThreads, 0, stream>>>(src, dst,
                                                                                       words);
  return cudaGetLastError();
}

}  // namespace trident::kernels::cuda::internal
