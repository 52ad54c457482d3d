#include <cstdint>

#include "kernels/cuda/pdl/pdl_device.h"
#include "kernels/cuda/peer_allreduce/peer_allreduce_kernel.h"

namespace trident::kernels::cuda::internal {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ void StoreRelease(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t LoadAcquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t Now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Thread q < ranks tells rank q that this rank's block reached `epoch` (in
// flag set `set`), then waits until rank q's block said the same here. A
// peer silent for timeout_ns raises the error word instead.
__device__ void Barrier(const PeerAllReduceArgs& a, int set, uint32_t epoch) {
  const int q = threadIdx.x;
  const int slot = set * kFlagWords + blockIdx.x * kMaxPeerAllReduceRanks;
  if (q < a.ranks) {
    StoreRelease(static_cast<uint32_t*>(a.signals[q]) + slot + a.rank, epoch);
    const uint32_t* mine = static_cast<const uint32_t*>(a.signals[a.rank]) + slot + q;
    const uint64_t start = Now();
    // Epochs only grow (wrapping after 2^32 calls: compared as a difference).
    while (static_cast<int32_t>(LoadAcquire(mine) - epoch) < 0) {
      if (Now() - start > static_cast<uint64_t>(a.timeout_ns)) {
        atomicExch(static_cast<uint32_t*>(a.signals[a.rank]) + kErrorOffset, 1u);
        break;
      }
    }
  }
  __syncthreads();
}

template <bool kVec4>
__global__ void __launch_bounds__(kThreads) PeerAllReduceKernel(PeerAllReduceArgs a) {
  // The norm after the sum, launched with programmatic dependent launch, may
  // be scheduled now (it waits for this grid to end), and the projection
  // after the norm with it: its first weight loads overlap the sum. Every
  // block of this grid is resident by then, so none waits behind them for a
  // slot while its peers spin.
  pdl::LetDependentsLaunch();
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) {
    uint32_t* counter = static_cast<uint32_t*>(a.signals[a.rank]) + kEpochOffset + blockIdx.x;
    epoch = *counter + 1;
    *counter = epoch;
  }
  __syncthreads();
  const uint32_t e = epoch;
  Barrier(a, 0, e);  // Every rank's input is written.
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  if constexpr (kVec4) {
    const int64_t n4 = a.count / 4;
    for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n4; i += stride) {
      float4 acc = reinterpret_cast<const float4*>(a.in[0])[i];
      for (int q = 1; q < a.ranks; ++q) {
        const float4 v = reinterpret_cast<const float4*>(a.in[q])[i];
        acc.x += v.x;
        acc.y += v.y;
        acc.z += v.z;
        acc.w += v.w;
      }
      if (a.accumulate) {
        const float4 o = reinterpret_cast<const float4*>(a.out)[i];
        acc.x = o.x + acc.x;
        acc.y = o.y + acc.y;
        acc.z = o.z + acc.z;
        acc.w = o.w + acc.w;
      }
      reinterpret_cast<float4*>(a.out)[i] = acc;
    }
  } else {
    for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < a.count; i += stride) {
      float acc = a.in[0][i];
      for (int q = 1; q < a.ranks; ++q) acc += a.in[q][i];
      a.out[i] = a.accumulate ? a.out[i] + acc : acc;
    }
  }
  if (a.skip_end_barrier) return;
  __syncthreads();
  Barrier(a, 1, e);  // Every rank is done reading the inputs.
}

}  // namespace

cudaError_t PeerAllReduce(const PeerAllReduceArgs& args, cudaStream_t stream) {
  bool vec4 = args.count % 4 == 0 && reinterpret_cast<uintptr_t>(args.out) % 16 == 0;
  for (int q = 0; q < args.ranks; ++q)
    vec4 = vec4 && reinterpret_cast<uintptr_t>(args.in[q]) % 16 == 0;
  // The block count depends on count only: the same on every rank (whose
  // pointers' alignment may differ), so block b always meets block b.
  int64_t blocks = ((args.count + 3) / 4 + kThreads - 1) / kThreads;
  blocks = blocks < 1 ? 1 : (blocks > kPeerAllReduceMaxBlocks ? kPeerAllReduceMaxBlocks : blocks);
  if (vec4) {
    PeerAllReduceKernel<true><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
  } else {
    PeerAllReduceKernel<false><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace trident::kernels::cuda::internal
