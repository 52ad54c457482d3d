// Copies fixed-size blocks between arbitrary addresses with the SMs: the
// data plane of a GPU-to-GPU KV lane. A prompt's KV leaves a prefill
// worker's pool as thousands of blocks (a 16-token block of one layer of a
// Llama-3-8B shape is 64 KiB), scattered on both sides; one copy-engine
// call per block costs microseconds of issue each, while one launch of
// this kernel moves them all. Source or destination may be another
// device's memory that the launching device can address (peer access
// enabled, or a CUDA IPC mapping of a peer's pool). The reference is
// memcpy per block.

#ifndef TRIDENT_KERNELS_CUDA_BLOCK_COPY_BLOCK_COPY_H_
#define TRIDENT_KERNELS_CUDA_BLOCK_COPY_BLOCK_COPY_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace trident::kernels::cuda {

struct BlockCopyArgs {
  // Device arrays (readable by the launching device) of num_blocks
  // pointers each: block i goes from src[i] to dst[i]. Every pointer is
  // 16-byte aligned; blocks do not overlap.
  const void* const* src = nullptr;
  void* const* dst = nullptr;
  int64_t num_blocks = 0;
  // A multiple of 16.
  int64_t block_bytes = 0;
};

// Enqueues the copies on `stream`. kInvalidArgument for a negative count, a
// block size not a positive multiple of 16, or null arrays; num_blocks 0 is
// a no-op.
absl::Status LaunchBlockCopy(const BlockCopyArgs& args, cudaStream_t stream);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_BLOCK_COPY_BLOCK_COPY_H_
