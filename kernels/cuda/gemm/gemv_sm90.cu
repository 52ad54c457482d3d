// Hopper's single-row GEMV: W streamed through shared memory by the bulk
// copy engine, in a pipeline deep enough to keep the read ceiling busy, whose
// first stages are issued before the kernel waits for the one ahead.

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/gemm/gemv_device.h"
#include "kernels/cuda/gemm/gemv_sm90_kernel.h"
#include "kernels/cuda/pdl/pdl_device.h"
#include "kernels/cuda/wgmma/wgmma_device.h"

namespace trident::kernels::cuda::internal {
namespace {

// y[n] (+)= x[k] · Wᵀ for one row x. The work is W's rows in items of
// kItemRows; each CTA (kCtasPerSm per SM at most) takes a contiguous run of
// items, so the CTAs' shares differ by one item at most and each CTA reads
// one contiguous range of W.
//
// One producer thread walks the CTA's items chunk by chunk (kChunk
// elements of each of the item's rows: a stage) and copies each stage into
// a ring of kStages shared buffers with the bulk copy engine. Four consumer
// warps, one per row of the item, take the stages in turn: each lane dots
// eight of the row's 16-byte pieces with x (read through L1) and, after the
// item's last chunk, the warp's lanes are summed and lane 0 writes y[row].
//
// Programmatic dependent launch: W does not depend on the kernel ahead (a
// norm, attention, the activation), so the producer starts at once and the
// ring fills while that kernel ends; the consumers wait for it (x, and y
// when accumulating, are its results).
//
// Two CTAs per SM: each CTA's consumers are then half of the SM's, and
// 192 KiB of W are in flight per SM (on an H200, 8B shape, one CTA per SM
// with 6 or 13 stages, and four with 3, were slower: bench/RESULTS.md).
constexpr int kItemRows = 4;
constexpr int kChunk = 2048;
constexpr int kStages = 6;
constexpr int kCtasPerSm = 2;
constexpr int kConsumerWarps = kItemRows;
constexpr int kThreads = (kConsumerWarps + 1) * 32;
constexpr uint32_t kRowBytes = kChunk * 2;
constexpr uint32_t kStageBytes = kItemRows * kRowBytes;
constexpr size_t kSharedBytes = kStages * kStageBytes + 2 * kStages * sizeof(uint64_t);

struct Walk {
  int64_t n, k;
  int64_t chunks;      // per item: ceil(k / kChunk)
  int64_t first_item;  // this CTA's first item
  int64_t stages;      // this CTA's items times chunks
};

__device__ __forceinline__ Walk MakeWalk(int64_t n, int64_t k) {
  Walk w;
  w.n = n;
  w.k = k;
  w.chunks = (k + kChunk - 1) / kChunk;
  const int64_t items = (n + kItemRows - 1) / kItemRows;
  w.first_item = items * blockIdx.x / gridDim.x;
  w.stages = (items * (blockIdx.x + 1) / gridDim.x - w.first_item) * w.chunks;
  return w;
}

// Where a CTA's walk is: the stage's ring slot and phase, and the item
// rows and the columns the stage covers. Next() steps without divisions.
struct Cursor {
  int slot = 0;
  uint32_t phase = 0;
  int64_t row0;     // the item's first row
  int64_t col = 0;  // the chunk's first column

  __device__ __forceinline__ explicit Cursor(const Walk& walk)
      : row0(walk.first_item * kItemRows) {}
  __device__ __forceinline__ bool LastChunk(int64_t k) const { return col + kChunk >= k; }
  __device__ __forceinline__ void Next(int64_t k) {
    if (++slot == kStages) {
      slot = 0;
      phase ^= 1;
    }
    col += kChunk;
    if (col >= k) {
      col = 0;
      row0 += kItemRows;
    }
  }
};

__device__ void Produce(const __nv_bfloat16* __restrict__ w, const Walk& walk, unsigned char* ring,
                        uint64_t* full, uint64_t* empty) {
  const uint64_t policy = wgmma::EvictFirstPolicy();
  Cursor at(walk);
  for (int64_t s = 0; s < walk.stages; ++s, at.Next(walk.k)) {
    // The slot's previous stage (one lap back, the other phase) consumed.
    if (s >= kStages) wgmma::BarrierWait(&empty[at.slot], at.phase ^ 1);
    const uint32_t bytes = static_cast<uint32_t>(min(int64_t{kChunk}, walk.k - at.col)) * 2;
    const int rows = static_cast<int>(min(int64_t{kItemRows}, walk.n - at.row0));
    wgmma::BarrierArriveExpectBytes(&full[at.slot], bytes * rows);
    unsigned char* const stage = ring + at.slot * kStageBytes;
    const __nv_bfloat16* const src = w + at.row0 * walk.k + at.col;
    for (int r = 0; r < rows; ++r) {
      wgmma::BulkLoad(stage + r * kRowBytes, src + r * walk.k, bytes, &full[at.slot], policy);
    }
  }
}

// The dot product of one row's chunk (its 16-byte pieces in shared memory)
// with x's matching pieces, accumulated into acc.
__device__ __forceinline__ float DotChunk(const uint4* ws, const uint4* xs, int pieces, int lane,
                                          float acc) {
  if (pieces == kChunk / 8) {
    constexpr int kPiecesPerLane = kChunk / 8 / 32;
    uint4 wv[kPiecesPerLane], xv[kPiecesPerLane];
#pragma unroll
    for (int i = 0; i < kPiecesPerLane; ++i) {
      wv[i] = ws[lane + 32 * i];
      xv[i] = __ldg(xs + lane + 32 * i);
    }
    float part[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < kPiecesPerLane; ++i) part[i & 1] = Dot8(wv[i], xv[i], part[i & 1]);
    return acc + (part[0] + part[1]);
  }
  for (int p = lane; p < pieces; p += 32) acc = Dot8(ws[p], __ldg(xs + p), acc);
  return acc;
}

template <bool kF32Out>
__device__ void Consume(const __nv_bfloat16* __restrict__ x, const void* __restrict__ bias,
                        void* __restrict__ y, bool accumulate, const Walk& walk,
                        const unsigned char* ring, uint64_t* full, uint64_t* empty) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const uint4* xs = reinterpret_cast<const uint4*>(x);
  float acc = 0.0f;
  Cursor at(walk);
  for (int64_t s = 0; s < walk.stages; ++s, at.Next(walk.k)) {
    wgmma::BarrierWait(&full[at.slot], at.phase);
    const int64_t row = at.row0 + warp;
    if (row < walk.n) {
      const int pieces = static_cast<int>(min(int64_t{kChunk}, walk.k - at.col) / 8);
      const unsigned char* const mine = ring + at.slot * kStageBytes + warp * kRowBytes;
      acc = DotChunk(reinterpret_cast<const uint4*>(mine), xs + at.col / 8, pieces, lane, acc);
    }
    __syncwarp();
    if (lane == 0) wgmma::BarrierArrive(&empty[at.slot]);
    if (at.LastChunk(walk.k)) {
      acc = WarpSum(acc);
      if (lane == 0 && row < walk.n) Store<kF32Out>(acc, bias, y, row, accumulate);
      acc = 0.0f;
    }
  }
}

template <bool kF32Out>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    GemvBulkKernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                   const void* __restrict__ bias, void* __restrict__ y, int64_t n, int64_t k,
                   bool accumulate) {
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + kStages * kStageBytes);
  uint64_t* const empty = full + kStages;
  const Walk walk = MakeWalk(n, k);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      wgmma::BarrierInit(&full[i], 1);                // the producer's expected bytes
      wgmma::BarrierInit(&empty[i], kConsumerWarps);  // each consumer warp's lane 0
    }
  }
  __syncthreads();
  pdl::LetDependentsLaunch();
  if (threadIdx.x / 32 == kConsumerWarps) {
    if (threadIdx.x % 32 == 0) Produce(w, walk, smem, full, empty);
    return;
  }
  pdl::WaitForPreviousGrid();
  Consume<kF32Out>(x, bias, y, accumulate, walk, smem, full, empty);
}

template <bool kF32Out>
cudaError_t Launch(const void* x, const void* w, const void* bias, void* y, int64_t n, int64_t k,
                   bool accumulate, bool pdl, cudaStream_t stream) {
  auto* kernel = &GemvBulkKernel<kF32Out>;
  cudaError_t error =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes);
  if (error != cudaSuccess) return error;
  int device = 0, sms = 0;
  error = cudaGetDevice(&device);
  if (error == cudaSuccess) {
    error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (error != cudaSuccess) return error;
  const int64_t items = (n + kItemRows - 1) / kItemRows;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(items, int64_t{sms} * kCtasPerSm));
  return pdl::Launch(kernel, dim3(grid), dim3(kThreads), kSharedBytes, stream, pdl,
                     static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w),
                     bias, y, n, k, accumulate);
}

}  // namespace

cudaError_t GemvBf16Bulk(const void* x, const void* w, const void* bias, void* y, int64_t n,
                         int64_t k, bool f32_out, bool accumulate, bool pdl, cudaStream_t stream) {
  return f32_out ? Launch<true>(x, w, bias, y, n, k, accumulate, pdl, stream)
                 : Launch<false>(x, w, bias, y, n, k, accumulate, pdl, stream);
}

}  // namespace trident::kernels::cuda::internal
