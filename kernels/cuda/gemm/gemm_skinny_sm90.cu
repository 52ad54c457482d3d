// Hopper's skinny GEMM: y[m, n] = x[m, k] · Wᵀ for a decode step's few rows.
// W is read once, through a ring of shared-memory stages filled by the
// tensor copy engine; wgmma multiplies each stage with W's rows as the
// 64-row A operand and x's rows as the narrow B operand (N = m rounded up to
// 16, 32 or 64), so the tensor cores do the work that bounds a GEMV at
// these batch sizes, and the pipeline keeps the read ceiling busy.
//
// Work: tiles of 64 or 128 W rows times chunks of 64 k values, shared
// among one CTA per SM as contiguous runs (skinny_split.h): a run's
// segments that span a whole tile write y; the others write partial sums
// to global memory, and the last CTA of a tile adds them up. Or, with
// SkinnyArgs::cluster_split where the tiles fit one wave: a cluster of 4
// (or 2) CTAs per tile, each on its share of k, adding the shares in the
// cluster's shared memory.
//
// CTA: one producer warp (one thread issues the copies) and one consumer
// warpgroup. Stage: W's tile rows x 64 k (8 KiB per 64 rows) and x's rows x
// 64 k, both 128-byte swizzled (one swizzle row per matrix row), as many
// stages as fit in 200 KiB. The producer copies the first stages' W before
// waiting for the kernel ahead (programmatic dependent launch): W is not
// its output, x is.

#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kernels/cuda/arch/shared_memory.h"
#include "kernels/cuda/gemm/gemm_skinny_sm90_kernel.h"
#include "kernels/cuda/gemm/skinny_split.h"
#include "kernels/cuda/pdl/pdl_device.h"
#include "kernels/cuda/wgmma/tensor_map.h"
#include "kernels/cuda/wgmma/wgmma_device.h"

namespace trident::kernels::cuda::internal {
namespace {

constexpr int kSliceRows = 64;  // wgmma's M
constexpr int kChunk = 64;      // k per stage: a 128-byte swizzle row of bf16
constexpr int kSliceBytes = kSliceRows * kChunk * 2;
constexpr int kConsumerThreads = 128;
constexpr int kConsumerWarps = kConsumerThreads / 32;
constexpr int kThreads = kConsumerThreads + 32;
constexpr int kRingBudget = 200 * 1024;

enum class Out { kBf16, kF32, kSiluMulBf16 };

template <int kSlices, int kN>
struct Shape {
  static constexpr int kWBytes = kSlices * kSliceBytes;
  static constexpr int kXBytes = kN * kChunk * 2;  // a multiple of 1024: swizzle atoms stay aligned
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kStages = kRingBudget / kStageBytes;
  static constexpr int kAccumulators = kN / 2;  // per slice and thread
  static constexpr int kSlotFloats = kSlices * kAccumulators * kConsumerThreads;
  static constexpr size_t kSharedBytes =
      static_cast<size_t>(kStages) * kStageBytes + 2 * kStages * sizeof(uint64_t) + 16;
};

struct Params {
  void* y;
  int64_t y_stride;
  const void* bias;
  int64_t m, n, k;
  bool accumulate;
  float* partials;
  int32_t* counters;
  int64_t tiles, chunks;
};

// W's first row of slice `slice` of tile `tile`. With kSiluMulBf16 a tile
// is kTileRows / 2 outputs: its gate rows, then the matching up rows.
template <Out kOut, int kSlices>
__device__ __forceinline__ int32_t SliceRow(int64_t tile, int slice, int64_t n) {
  if constexpr (kOut == Out::kSiluMulBf16) {
    constexpr int kHalf = kSlices / 2;
    const int64_t row = tile * kHalf * kSliceRows + (slice % kHalf) * kSliceRows;
    return static_cast<int32_t>(slice < kHalf ? row : n + row);
  } else {
    return static_cast<int32_t>((tile * kSlices + slice) * kSliceRows);
  }
}

// A run's position: ring slot and phase, tile and chunk. Next() steps
// without divisions.
template <int kStages>
struct Cursor {
  int slot = 0;
  uint32_t phase = 0;
  int64_t tile, chunk;
  __device__ __forceinline__ Cursor(int64_t unit, int64_t chunks)
      : tile(unit / chunks), chunk(unit % chunks) {}
  __device__ __forceinline__ void Next(int64_t chunks) {
    if (++slot == kStages) {
      slot = 0;
      phase ^= 1;
    }
    if (++chunk == chunks) {
      chunk = 0;
      ++tile;
    }
  }
};

template <Out kOut, int kSlices, int kN>
__device__ void Produce(const CUtensorMap* w_map, const CUtensorMap* x_map, const Params& p,
                        int64_t begin, int64_t end, unsigned char* ring, uint64_t* full,
                        uint64_t* empty) {
  using S = Shape<kSlices, kN>;
  const uint64_t policy = wgmma::EvictFirstPolicy();
  const int64_t total = end - begin;
  const int64_t head = min(total, int64_t{S::kStages});
  Cursor<S::kStages> at(begin, p.chunks);
  for (int64_t s = 0; s < total; ++s, at.Next(p.chunks)) {
    if (s >= S::kStages) wgmma::BarrierWait(&empty[at.slot], at.phase ^ 1);
    unsigned char* const stage = ring + at.slot * S::kStageBytes;
    const int32_t col = static_cast<int32_t>(at.chunk * kChunk);
    wgmma::BarrierArriveExpectBytes(&full[at.slot], S::kStageBytes);
#pragma unroll
    for (int slice = 0; slice < kSlices; ++slice) {
      wgmma::TensorLoad2dHint(stage + slice * kSliceBytes, w_map, col,
                              SliceRow<kOut, kSlices>(at.tile, slice, p.n), &full[at.slot], policy);
    }
    if (s >= head) wgmma::TensorLoad2d(stage + S::kWBytes, x_map, col, 0, &full[at.slot]);
    if (s == head - 1) {
      // The ring's first lap holds W; x is the kernel ahead's output.
      pdl::WaitForPreviousGrid();
      for (int64_t j = 0; j < head; ++j) {
        const int32_t c = static_cast<int32_t>((begin + j) % p.chunks * kChunk);
        wgmma::TensorLoad2d(ring + j * S::kStageBytes + S::kWBytes, x_map, c, 0, &full[j]);
      }
    }
  }
}

// One stage's products: 4 k16 steps per slice.
template <int kSlices, int kN>
__device__ __forceinline__ void MultiplyStage(const unsigned char* stage,
                                              float (&acc)[kSlices][kN / 2], bool overwrite) {
  using S = Shape<kSlices, kN>;
  wgmma::Fence();
#pragma unroll
  for (int step = 0; step < kChunk / 16; ++step) {
    const uint64_t b = wgmma::Swizzle128Descriptor(stage + S::kWBytes + step * 32, 1024);
#pragma unroll
    for (int slice = 0; slice < kSlices; ++slice) {
      const uint64_t a = wgmma::Swizzle128Descriptor(stage + slice * kSliceBytes + step * 32, 1024);
      wgmma::MmaM64NK16Bf16<kN>(a, b, acc[slice], !(overwrite && step == 0));
    }
  }
  wgmma::CommitGroup();
}

__device__ __forceinline__ void ConsumerBarrier() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
}

// The output index and x row of accumulator i of slice `slice` (fragment of
// m64nN: i = 4 j + 2 h + e is W row 16 warp + lane / 4 + 8 h of the slice
// and x row 8 j + 2 (lane % 4) + e).
struct Place {
  int64_t out, row;
};
template <int kOutSlices, int kN>
__device__ __forceinline__ Place PlaceOf(int64_t tile, int slice, int i) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  return {(tile * kOutSlices + slice) * kSliceRows + 16 * warp + lane / 4 + 8 * ((i / 2) % 2),
          8 * (i / 4) + 2 * (lane % 4) + i % 2};
}

// Every output of a tile's fragment (StoreTile's `keep`).
struct AllOutputs {
  __device__ __forceinline__ bool operator()(int /*slice*/, int /*i*/) const { return true; }
};

// Writes a tile's sums, those of output slice `slice` and accumulator i
// where keep(slice, i). Per slice, every load (bias, y's old values) is
// issued before any store, so the loads overlap instead of each waiting for
// the store ahead (which the compiler cannot prove does not alias it).
template <Out kOut, int kSlices, int kN, typename Keep>
__device__ __forceinline__ void StoreTile(const float (&v)[kSlices][kN / 2], int64_t tile,
                                          const Params& p, Keep keep) {
  constexpr int kOutSlices = kOut == Out::kSiluMulBf16 ? kSlices / 2 : kSlices;
#pragma unroll
  for (int slice = 0; slice < kOutSlices; ++slice) {
    float add[kN / 2], add_up[kN / 2];
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      const Place at = PlaceOf<kOutSlices, kN>(tile, slice, i);
      add[i] = add_up[i] = 0.0f;
      if (!keep(slice, i) || at.out >= p.n || at.row >= p.m) continue;
      if constexpr (kOut == Out::kSiluMulBf16) {
        if (p.bias != nullptr) {
          add[i] = static_cast<const float*>(p.bias)[at.out];
          add_up[i] = static_cast<const float*>(p.bias)[p.n + at.out];
        }
      } else if constexpr (kOut == Out::kF32) {
        if (p.bias != nullptr) add[i] = static_cast<const float*>(p.bias)[at.out];
        if (p.accumulate) add[i] += static_cast<const float*>(p.y)[at.row * p.y_stride + at.out];
      } else {
        const auto* const y = static_cast<const __nv_bfloat16*>(p.y);
        if (p.bias != nullptr) {
          add[i] = __bfloat162float(static_cast<const __nv_bfloat16*>(p.bias)[at.out]);
        }
        if (p.accumulate) add[i] += __bfloat162float(y[at.row * p.y_stride + at.out]);
      }
    }
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      const Place at = PlaceOf<kOutSlices, kN>(tile, slice, i);
      if (!keep(slice, i) || at.out >= p.n || at.row >= p.m) continue;
      const int64_t offset = at.row * p.y_stride + at.out;
      if constexpr (kOut == Out::kSiluMulBf16) {
        const float gate = v[slice][i] + add[i];
        const float up = v[slice + kOutSlices][i] + add_up[i];
        static_cast<__nv_bfloat16*>(p.y)[offset] =
            __float2bfloat16_rn(gate / (1.0f + __expf(-gate)) * up);
      } else if constexpr (kOut == Out::kF32) {
        static_cast<float*>(p.y)[offset] = v[slice][i] + add[i];
      } else {
        static_cast<__nv_bfloat16*>(p.y)[offset] = __float2bfloat16_rn(v[slice][i] + add[i]);
      }
    }
  }
}

// A segment that covered part of its tile: its partial sums go to the
// CTA's slot; the tile's last CTA to arrive adds every slot in CTA order
// (into acc) and writes y, and re-arms the tile's counter.
template <Out kOut, int kSlices, int kN>
__device__ void FinishPartial(float (&acc)[kSlices][kN / 2], int64_t tile, const Params& p,
                              const SkinnySplit& split, int32_t* arrivals) {
  using S = Shape<kSlices, kN>;
  const int t = threadIdx.x;
  float* const mine = p.partials + split.Slot(blockIdx.x, tile) * S::kSlotFloats;
#pragma unroll
  for (int slice = 0; slice < kSlices; ++slice) {
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      __stcg(mine + (slice * (kN / 2) + i) * kConsumerThreads + t, acc[slice][i]);
    }
  }
  __threadfence();
  ConsumerBarrier();
  const int64_t first = split.FirstCta(tile);
  const int64_t last = split.LastCta(tile);
  if (t == 0) *arrivals = atomicAdd(&p.counters[tile], 1);
  ConsumerBarrier();
  const bool reduce = *arrivals == last - first;
  ConsumerBarrier();  // *arrivals read before the next segment writes it
  if (!reduce) return;
  __threadfence();
  if (t == 0) p.counters[tile] = 0;
    // Every slot, this CTA's too, in CTA order: the sum does not depend on
    // the order of arrival.
#pragma unroll
  for (int slice = 0; slice < kSlices; ++slice) {
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) acc[slice][i] = 0.0f;
  }
  for (int64_t b = first; b <= last; ++b) {
    const float* const slot = p.partials + split.Slot(b, tile) * S::kSlotFloats;
#pragma unroll
    for (int slice = 0; slice < kSlices; ++slice) {
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) {
        acc[slice][i] += __ldcg(slot + (slice * (kN / 2) + i) * kConsumerThreads + t);
      }
    }
  }
  StoreTile<kOut, kSlices, kN>(acc, tile, p, AllOutputs{});
}

// The cluster's reduction of a tile whose k its kCluster CTAs split: each
// CTA puts its sums in its own shared memory (the ring, every stage of which
// has been consumed), and after a cluster barrier adds, for the outputs it
// owns (every kCluster-th accumulator), the cluster's sums in rank order
// (deterministic) and writes them. A second barrier keeps each CTA's shared
// memory alive until every CTA has read it.
template <Out kOut, int kSlices, int kN, int kCluster>
__device__ void ClusterFinish(float (&acc)[kSlices][kN / 2], int64_t tile, const Params& p,
                              unsigned char* ring) {
  static_assert(kOut != Out::kSiluMulBf16, "the fused SwiGLU splits k stream-K style");
  const int t = threadIdx.x;
  const int rank = static_cast<int>(blockIdx.x % kCluster);
  float* const mine = reinterpret_cast<float*>(ring);
#pragma unroll
  for (int slice = 0; slice < kSlices; ++slice) {
#pragma unroll
    for (int i = 0; i < kN / 2; ++i)
      mine[(slice * (kN / 2) + i) * kConsumerThreads + t] = acc[slice][i];
  }
  wgmma::ClusterSync();
  uint32_t theirs[kCluster];  // this thread's first sum in each rank's shared memory
#pragma unroll
  for (int q = 0; q < kCluster; ++q) theirs[q] = wgmma::ClusterSharedAddress(mine + t, q);
  auto owned = [rank](int slice, int i) { return (slice * (kN / 2) + i) % kCluster == rank; };
#pragma unroll
  for (int slice = 0; slice < kSlices; ++slice) {
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      if (!owned(slice, i)) continue;
      const uint32_t offset = (slice * (kN / 2) + i) * kConsumerThreads * sizeof(float);
      float sum = 0.0f;
#pragma unroll
      for (int q = 0; q < kCluster; ++q) sum += wgmma::LoadClusterShared(theirs[q] + offset);
      acc[slice][i] = sum;
    }
  }
  wgmma::ClusterSync();
  StoreTile<kOut, kSlices, kN>(acc, tile, p, owned);
}

// kCluster > 0: the run is one tile's share of k, and the cluster adds the
// shares up (ClusterFinish); 0: stream-K's segments and fix-ups.
template <Out kOut, int kSlices, int kN, int kCluster>
__device__ void Consume(const Params& p, const SkinnySplit& split, int64_t begin, int64_t end,
                        unsigned char* ring, uint64_t* full, uint64_t* empty, int32_t* arrivals) {
  using S = Shape<kSlices, kN>;
  const int lane = threadIdx.x % 32;
  float acc[kSlices][kN / 2];
#pragma unroll
  for (int slice = 0; slice < kSlices; ++slice) {
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) acc[slice][i] = 0.0f;
  }
  Cursor<S::kStages> at(begin, p.chunks);
  int64_t segment_first_chunk = at.chunk;
  int pending = -1;  // the slot whose products may still be running
  for (int64_t s = begin; s < end; ++s, at.Next(p.chunks)) {
    wgmma::BarrierWait(&full[at.slot], at.phase);
    const bool first = at.chunk == segment_first_chunk;
    MultiplyStage<kSlices, kN>(ring + at.slot * S::kStageBytes, acc, first);
    const bool last = at.chunk == p.chunks - 1 || s == end - 1;
    // One group stays in flight while the next stage is awaited; the
    // segment's last waits for all (branches around in-flight products are
    // uniform: see the role's shuffle in the kernel).
    wgmma::WaitGroup<1>();
    if (pending >= 0 && lane == 0) wgmma::BarrierArrive(&empty[pending]);
    pending = at.slot;
    if (!last) continue;
    wgmma::WaitGroup<0>();
    if (lane == 0) wgmma::BarrierArrive(&empty[at.slot]);
    pending = -1;
    if constexpr (kCluster == 0) {
      if (segment_first_chunk == 0 && at.chunk == p.chunks - 1) {
        StoreTile<kOut, kSlices, kN>(acc, at.tile, p, AllOutputs{});
      } else {
        FinishPartial<kOut, kSlices, kN>(acc, at.tile, p, split, arrivals);
      }
    }
    segment_first_chunk = 0;
  }
  if constexpr (kCluster > 0) {
    ClusterFinish<kOut, kSlices, kN, kCluster>(acc, blockIdx.x / kCluster, p, ring);
  }
}

// Where CTA b's run of units starts (and CTA b - 1's ends): its stream-K
// share, or with kCluster, rank b % kCluster's share of tile b / kCluster's
// k (the last rank's end is the next tile's start).
template <int kCluster>
__device__ __forceinline__ int64_t RunStart(const Params& p, const SkinnySplit& split, int64_t b) {
  if constexpr (kCluster == 0) {
    return split.Start(b);
  } else {
    const int64_t share = (p.chunks + kCluster - 1) / kCluster;
    return b / kCluster * p.chunks + min(p.chunks, b % kCluster * share);
  }
}

template <Out kOut, int kSlices, int kN, int kCluster>
__global__ void __launch_bounds__(kThreads, 1)
    SkinnyKernel(const Params params, const __grid_constant__ CUtensorMap w_map,
                 const __grid_constant__ CUtensorMap x_map) {
  using S = Shape<kSlices, kN>;
  extern __shared__ __align__(1024) unsigned char smem[];
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + S::kStages * S::kStageBytes);
  uint64_t* const empty = full + S::kStages;
  int32_t* const arrivals = reinterpret_cast<int32_t*>(empty + S::kStages);
  const Params& p = params;
  const SkinnySplit split(p.tiles, p.chunks, gridDim.x);
  const int64_t begin = RunStart<kCluster>(p, split, blockIdx.x);
  const int64_t end = RunStart<kCluster>(p, split, blockIdx.x + 1);
  if (threadIdx.x == 0) {
    for (int i = 0; i < S::kStages; ++i) {
      wgmma::BarrierInit(&full[i], 1);                // the producer's expected bytes
      wgmma::BarrierInit(&empty[i], kConsumerWarps);  // each consumer warp's lane 0
    }
  }
  __syncthreads();
  pdl::LetDependentsLaunch();
  // The role as a warp-uniform value (a shuffle's result), so that the
  // compiler sees the consumer's branches as uniform.
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  if (warpgroup != 0) {
    if (threadIdx.x == kConsumerThreads) {
      Produce<kOut, kSlices, kN>(&w_map, &x_map, p, begin, end, smem, full, empty);
    }
    return;
  }
  pdl::WaitForPreviousGrid();
  Consume<kOut, kSlices, kN, kCluster>(p, split, begin, end, smem, full, empty, arrivals);
}

int SlicesOf(const SkinnyArgs& args) { return args.tile_rows / kSliceRows; }

// The batch's rows rounded up to the product's N.
int NOf(const SkinnyArgs& args) { return args.m <= 16 ? 16 : args.m <= 32 ? 32 : 64; }

int64_t TilesOf(const SkinnyArgs& args) {
  const int64_t outputs_per_tile = args.silu_mul ? args.tile_rows / 2 : args.tile_rows;
  return (args.n + outputs_per_tile - 1) / outputs_per_tile;
}

// Enqueues the kernel: kCluster > 0 runs each tile on a cluster of
// kCluster CTAs (grid: tiles x kCluster), 0 shares the units stream-K style
// among up to `sms` CTAs.
template <Out kOut, int kSlices, int kN, int kCluster>
cudaError_t LaunchShape(const SkinnyArgs& args, const SkinnyScratch& scratch, int sms,
                        cudaStream_t stream) {
  using S = Shape<kSlices, kN>;
  CUtensorMap w_map{}, x_map{};
  const uint64_t w_rows = args.silu_mul ? 2 * args.n : args.n;
  if (!wgmma::EncodeRowMap(&w_map, args.w, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, args.k, w_rows,
                           args.k * 2, kChunk, kSliceRows, CU_TENSOR_MAP_SWIZZLE_128B) ||
      !wgmma::EncodeRowMap(&x_map, args.x, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, args.k, args.m,
                           args.x_stride * 2, kChunk, kN, CU_TENSOR_MAP_SWIZZLE_128B)) {
    return cudaErrorInvalidValue;
  }
  auto* kernel = &SkinnyKernel<kOut, kSlices, kN, kCluster>;
  static std::atomic<uint64_t> configured{0};
  const cudaError_t error = ConfigureSharedMemoryOnce(kernel, S::kSharedBytes, configured);
  if (error != cudaSuccess) return error;
  Params p{};
  p.y = args.y;
  p.y_stride = args.y_stride;
  p.bias = args.bias;
  p.m = args.m;
  p.n = args.n;
  p.k = args.k;
  p.accumulate = args.accumulate;
  p.partials = static_cast<float*>(scratch.partials);
  p.counters = scratch.counters;
  p.tiles = TilesOf(args);
  p.chunks = (args.k + kChunk - 1) / kChunk;
  const unsigned grid = static_cast<unsigned>(
      kCluster > 0 ? p.tiles * kCluster : std::min<int64_t>(p.tiles * p.chunks, sms));
  return pdl::LaunchClustered(kernel, dim3(grid), dim3(kThreads), S::kSharedBytes, stream, args.pdl,
                              kCluster > 0 ? kCluster : 1, p, w_map, x_map);
}

// How many clusters of kCluster CTAs of the kernel the device runs at once,
// asked once per device (0 when the query fails).
template <Out kOut, int kN, int kCluster>
int ActiveClusters() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int32_t> known[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= kMaxDevices) return 0;
  if (const int32_t n = known[device].load(std::memory_order_acquire); n > 0) return n;
  using S = Shape<2, kN>;
  auto* kernel = &SkinnyKernel<kOut, 2, kN, kCluster>;
  static std::atomic<uint64_t> configured{0};
  if (ConfigureSharedMemoryOnce(kernel, S::kSharedBytes, configured) != cudaSuccess) return 0;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(kCluster);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = S::kSharedBytes;
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kCluster;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &config) != cudaSuccess) return 0;
  known[device].store(n, std::memory_order_release);
  return n;
}

// With args.cluster_split, a call of 128-row tiles whose tiles run in one
// wave as clusters of 4 CTAs (each on a quarter of k) takes 4, else 2 if
// they fit as pairs; 0: stream-K.
template <Out kOut, int kN>
int ClusterSizeOf(const SkinnyArgs& args, int sms) {
  if (!args.cluster_split || SlicesOf(args) != 2) return 0;
  const int64_t tiles = TilesOf(args);
  const int64_t chunks = (args.k + kChunk - 1) / kChunk;
  if (tiles * 4 <= sms && chunks >= 4 && tiles <= ActiveClusters<kOut, kN, 4>()) return 4;
  if (tiles * 2 <= sms && chunks >= 2 && tiles <= ActiveClusters<kOut, kN, 2>()) return 2;
  return 0;
}

template <Out kOut, int kN>
cudaError_t LaunchN(const SkinnyArgs& args, const SkinnyScratch& scratch, int sms,
                    cudaStream_t stream) {
  if constexpr (kOut != Out::kSiluMulBf16) {
    if (SlicesOf(args) == 1) return LaunchShape<kOut, 1, kN, 0>(args, scratch, sms, stream);
    switch (ClusterSizeOf<kOut, kN>(args, sms)) {
      case 4:
        return LaunchShape<kOut, 2, kN, 4>(args, scratch, sms, stream);
      case 2:
        return LaunchShape<kOut, 2, kN, 2>(args, scratch, sms, stream);
      default:
        break;
    }
  }
  return LaunchShape<kOut, 2, kN, 0>(args, scratch, sms, stream);
}

template <Out kOut>
int ClusterSizeOut(const SkinnyArgs& args, int sms) {
  const int n = NOf(args);
  if (n == 64) return ClusterSizeOf<kOut, 64>(args, sms);
  if (n == 32) return ClusterSizeOf<kOut, 32>(args, sms);
  return ClusterSizeOf<kOut, 16>(args, sms);
}

template <Out kOut>
cudaError_t LaunchOut(const SkinnyArgs& args, const SkinnyScratch& scratch, int sms,
                      cudaStream_t stream) {
  const int n = NOf(args);
  if (n == 64) return LaunchN<kOut, 64>(args, scratch, sms, stream);
  if (n == 32) return LaunchN<kOut, 32>(args, scratch, sms, stream);
  return LaunchN<kOut, 16>(args, scratch, sms, stream);
}

}  // namespace

bool SkinnySuits(const SkinnyArgs& args) {
  return args.m >= 2 && args.m <= kSkinnyMaxRows && args.n > 0 && args.k > 0 && args.k % 8 == 0 &&
         args.x_stride % 8 == 0 && args.x_stride >= args.k &&
         reinterpret_cast<uintptr_t>(args.x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(args.w) % 16 == 0 &&
         (args.tile_rows == 128 || (args.tile_rows == 64 && !args.silu_mul)) &&
         (!args.silu_mul || (!args.f32_out && !args.accumulate));
}

int SkinnyClusterSize(const SkinnyArgs& args, int sms) {
  if (!SkinnySuits(args) || args.silu_mul || sms <= 0) return 0;
  return args.f32_out ? ClusterSizeOut<Out::kF32>(args, sms)
                      : ClusterSizeOut<Out::kBf16>(args, sms);
}

size_t SkinnyPartialBytes(const SkinnyArgs& args, int sms) {
  const size_t slot = static_cast<size_t>(SlicesOf(args)) * (NOf(args) / 2) * kConsumerThreads;
  return 2 * static_cast<size_t>(std::max(sms, 1)) * slot * sizeof(float);
}

size_t SkinnyCounterBytes(const SkinnyArgs& args) {
  return static_cast<size_t>(TilesOf(args)) * sizeof(int32_t);
}

cudaError_t GemmSkinny(const SkinnyArgs& args, const SkinnyScratch& scratch, int sms,
                       cudaStream_t stream) {
  if (!SkinnySuits(args) || sms <= 0 || scratch.partials == nullptr ||
      scratch.counters == nullptr || scratch.partial_bytes < SkinnyPartialBytes(args, sms) ||
      scratch.counter_bytes < SkinnyCounterBytes(args)) {
    return cudaErrorInvalidValue;
  }
  if (args.silu_mul) return LaunchOut<Out::kSiluMulBf16>(args, scratch, sms, stream);
  if (args.f32_out) return LaunchOut<Out::kF32>(args, scratch, sms, stream);
  return LaunchOut<Out::kBf16>(args, scratch, sms, stream);
}

}  // namespace trident::kernels::cuda::internal
