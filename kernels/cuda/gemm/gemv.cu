#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/gemm/gemv_device.h"
#include "kernels/cuda/gemm/gemv_kernel.h"
#include "kernels/cuda/pdl/pdl_device.h"

namespace trident::kernels::cuda::internal {
namespace {

__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Programmatic dependent launch (kernels/cuda/pdl): a GEMV launched with it
// may start while the kernel before it (a norm, the activation, attention)
// still runs, once that kernel lets its dependents launch. The weights do
// not depend on that kernel, so the first steps' loads are issued at once;
// x does, so the kernel waits for the previous grid to end (and its writes
// to be visible) before the first x load. Both are no-ops in a launch
// without it.
using pdl::LetDependentsLaunch;
using pdl::WaitForPreviousGrid;

// y[n] (+)= x[k] · Wᵀ for one row of x (a single sequence's decode step): a
// weight-streaming kernel. Each warp owns two rows of W and sweeps them
// along k, 16 bytes per lane per load, four loads per row in flight
// (bypassing L1: weights are read once), applying x (through L1) on CUDA
// cores; a butterfly of shuffles sums the lanes and lane r writes
// y[row0 + r].
constexpr int kRows = 2;
constexpr int kSteps = 4;
constexpr int kWarpsPerBlock = 4;

template <bool kF32Out>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    GemvKernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
               const void* __restrict__ bias, void* __restrict__ y, int64_t n, int64_t k,
               bool accumulate) {
  constexpr int R = kRows;
  constexpr int U = kSteps;
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5)) * R;
  if (row0 >= n) return;
  const int64_t k8 = k / 8;
  const uint4* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = row0 + r < n ? row0 + r : n - 1;  // past n: dropped
    rows[r] = reinterpret_cast<const uint4*>(w + row * k);
  }
  float acc[R] = {};
  uint4 wv[U][R];
  const auto load_w = [&](int64_t base) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * 32;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wv[u][r] = i < k8 ? LoadStreaming(rows[r] + i) : make_uint4(0, 0, 0, 0);
      }
    }
  };
  LetDependentsLaunch();
  load_w(lane);
  WaitForPreviousGrid();
  for (int64_t base = lane; base < k8; base += 32 * U) {
    if (base != lane) load_w(base);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * 32;
      if (i >= k8) break;
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) Unpack(wv[u][r], wf[r]);
      float xf[8];
      Unpack(__ldg(reinterpret_cast<const uint4*>(x) + i), xf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r] = fmaf(xf[j], wf[r][j], acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    acc[r] = WarpSum(acc[r]);
    if (lane == r && row0 + r < n) Store<kF32Out>(acc[r], bias, y, row0 + r, accumulate);
  }
}

}  // namespace

cudaError_t GemvBf16(const void* x, const void* w, const void* bias, void* y, int64_t n, int64_t k,
                     bool f32_out, bool accumulate, bool pdl, cudaStream_t stream) {
  const int64_t warps = (n + kRows - 1) / kRows;
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const auto* wb = static_cast<const __nv_bfloat16*>(w);
  return pdl::Launch(f32_out ? &GemvKernel<true> : &GemvKernel<false>,
                     dim3(static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock)),
                     dim3(kWarpsPerBlock * 32), 0, stream, pdl, xb, wb, bias, y, n, k, accumulate);
}

}  // namespace trident::kernels::cuda::internal
