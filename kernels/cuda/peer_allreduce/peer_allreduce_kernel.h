#ifndef TRIDENT_KERNELS_CUDA_PEER_ALLREDUCE_PEER_ALLREDUCE_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_PEER_ALLREDUCE_PEER_ALLREDUCE_KERNEL_H_

// The launcher nvcc compiles and the signal area's layout; the .cc checks
// arguments first.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/peer_allreduce/peer_allreduce.h"

namespace trident::kernels::cuda::internal {

// Blocks of the kernel at most: each owns a slice of the vector and its own
// flags, so no block waits on another block of its rank.
inline constexpr int kPeerAllReduceMaxBlocks = 32;

// Signal area, uint32 words: start flags [block][writer rank], end flags
// [block][writer rank], this rank's epoch per block, the error word.
inline constexpr int kFlagWords = kPeerAllReduceMaxBlocks * kMaxPeerAllReduceRanks;
inline constexpr int kEpochOffset = 2 * kFlagWords;
inline constexpr int kErrorOffset = kEpochOffset + kPeerAllReduceMaxBlocks;
inline constexpr int kSignalWords = kErrorOffset + 1;

cudaError_t PeerAllReduce(const PeerAllReduceArgs& args, cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_PEER_ALLREDUCE_PEER_ALLREDUCE_KERNEL_H_
