#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/gemm/gemv_kernel.h"

namespace trident::kernels::cuda::internal {
namespace {

// y[m][n] (+)= x[m][k] · Wᵀ for a handful of rows of x (m <= 16): a
// weight-streaming kernel on the tensor cores. A block owns 16 rows of W;
// its KW warps split k between them (interleaved 32-element chunks, so the
// block reads each row's bytes together) and their partial sums meet in
// shared memory at the end.
//
// Each step a warp reads 16 rows x 32 k of W (1 KiB, 16 bytes per lane:
// lane = 4 g + c reads k0 + 8c .. 8c + 7 of rows g and g + 8) and the same
// 8 k of x's row g (and g + 8 for m > 8), and feeds them to two (four)
// mma.m16n8k16 as they are: a sum over k does not care about k's order, so
// the fragment layout's k positions {2c, 2c + 1, 2c + 8, 2c + 9} simply
// stand for k0 + 8c + {0..3} in the first mma and + {4..7} in the second,
// for W and x alike. No shuffle is needed: the accumulator fragment leaves
// lane (g, c) with y[2c, 2c + 1][g, g + 8]. Weights bypass L1 (read once);
// U steps of loads are in flight per warp.
constexpr int kRowsPerBlock = 16;

__device__ __forceinline__ uint4 LoadStreaming(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Programmatic dependent launch: a GEMV launched with it may start while
// the kernel before it (a norm, the activation, attention) still runs, once
// that kernel lets its dependents launch. The weights do not depend on that
// kernel, so the first steps' loads are issued at once; x does, so the
// kernel waits for the previous grid to end (and its writes to be visible)
// before the first x load. Both are no-ops in a launch without it.
__device__ __forceinline__ void LetDependentsLaunch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ void WaitForPreviousGrid() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// Adds the bias (and y's old value with `accumulate`) and writes y[m][row].
template <bool kF32Out>
__device__ __forceinline__ void Store(float v, const void* bias, void* y, int64_t y_stride, int m,
                                      int64_t row, bool accumulate) {
  if constexpr (kF32Out) {
    float* out = static_cast<float*>(y) + m * y_stride + row;
    if (bias != nullptr) v += static_cast<const float*>(bias)[row];
    if (accumulate) v += *out;
    *out = v;
  } else {
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(y) + m * y_stride + row;
    if (bias != nullptr) v += __bfloat162float(static_cast<const __nv_bfloat16*>(bias)[row]);
    if (accumulate) v += __bfloat162float(*out);
    *out = __float2bfloat16_rn(v);
  }
}

// d += a · b over one m16n8k16 tile (bf16 in, fp32 accumulate).
__device__ __forceinline__ void Mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// NT: 8-column tiles of x's rows (1 for m <= 8, 2 for m <= 16); KW: warps
// per block splitting k; U: steps of loads in flight per warp.
template <int NT, int KW, int U, bool kF32Out>
__global__ void __launch_bounds__(KW * 32)
    GemvKernel(const __nv_bfloat16* __restrict__ x, int64_t x_stride,
               const __nv_bfloat16* __restrict__ w, const void* __restrict__ bias,
               void* __restrict__ y, int64_t y_stride, int m, int64_t n, int64_t k,
               bool accumulate) {
  __shared__ float partial[KW][kRowsPerBlock][8 * NT];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int c = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  // Rows past n re-read the last row; their sums are dropped.
  const int64_t row_lo = row0 + g < n ? row0 + g : n - 1;
  const int64_t row_hi = row0 + g + 8 < n ? row0 + g + 8 : n - 1;
  const __nv_bfloat16* w_lo = w + row_lo * k + 8 * c;
  const __nv_bfloat16* w_hi = w + row_hi * k + 8 * c;
  const __nv_bfloat16* xs[NT];
  bool x_live[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    x_live[t] = g + 8 * t < m;
    xs[t] = x + (x_live[t] ? g + 8 * t : 0) * x_stride + 8 * c;
  }
  float acc[NT][4] = {};
  // Steps: 32-element chunks of k, warp `warp` taking chunks warp, warp +
  // KW, ...; a lane's 8 elements are in range or wholly out (k % 8 == 0).
  const int64_t chunks = (k + 31) / 32;
  uint4 lo[U], hi[U];
  const auto load_w = [&](int64_t chunk) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t kk = (chunk + static_cast<int64_t>(u) * KW) * 32;
      const bool in = kk + 8 * c < k;
      lo[u] = in ? LoadStreaming(reinterpret_cast<const uint4*>(w_lo + kk)) : make_uint4(0, 0, 0, 0);
      hi[u] = in ? LoadStreaming(reinterpret_cast<const uint4*>(w_hi + kk)) : make_uint4(0, 0, 0, 0);
    }
  };
  LetDependentsLaunch();
  load_w(warp);
  WaitForPreviousGrid();
  for (int64_t chunk = warp; chunk < chunks; chunk += static_cast<int64_t>(KW) * U) {
    if (chunk != warp) load_w(chunk);
    uint4 xv[U][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t kk = (chunk + static_cast<int64_t>(u) * KW) * 32;
      const bool in = kk + 8 * c < k;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        xv[u][t] = in && x_live[t] ? __ldg(reinterpret_cast<const uint4*>(xs[t] + kk))
                                   : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        Mma(acc[t], lo[u].x, hi[u].x, lo[u].y, hi[u].y, xv[u][t].x, xv[u][t].y);
        Mma(acc[t], lo[u].z, hi[u].z, lo[u].w, hi[u].w, xv[u][t].z, xv[u][t].w);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    partial[warp][g][8 * t + 2 * c] = acc[t][0];
    partial[warp][g][8 * t + 2 * c + 1] = acc[t][1];
    partial[warp][g + 8][8 * t + 2 * c] = acc[t][2];
    partial[warp][g + 8][8 * t + 2 * c + 1] = acc[t][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kRowsPerBlock * 8 * NT; i += KW * 32) {
    const int r = i / (8 * NT);
    const int col = i % (8 * NT);
    const int64_t row = row0 + r;
    if (col >= m || row >= n) continue;
    float v = 0.0f;
#pragma unroll
    for (int q = 0; q < KW; ++q) v += partial[q][r][col];
    Store<kF32Out>(v, bias, y, y_stride, col, row, accumulate);
  }
}

// For one or two rows of x the tensor cores buy nothing (7/8 of each mma
// would be padding) and 64-byte row segments read less well than a warp's
// 512 contiguous bytes: here each warp owns two rows of W and sweeps them
// along k, 16 bytes per lane per load, four loads per row in flight,
// applying x's rows (through L1) on CUDA cores; a butterfly of shuffles
// sums the lanes and lane m * 2 + r writes y[m][row0 + r].
constexpr int kCoreRows = 2;
constexpr int kCoreSteps = 4;
constexpr int kCoreWarpsPerBlock = 4;

__device__ __forceinline__ void Unpack(const uint4& v, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

template <int M, bool kF32Out>
__global__ void __launch_bounds__(kCoreWarpsPerBlock * 32)
    GemvCoreKernel(const __nv_bfloat16* __restrict__ x, int64_t x_stride,
                   const __nv_bfloat16* __restrict__ w, const void* __restrict__ bias,
                   void* __restrict__ y, int64_t y_stride, int64_t n, int64_t k,
                   bool accumulate) {
  constexpr int R = kCoreRows;
  constexpr int U = kCoreSteps;
  const int lane = threadIdx.x & 31;
  const int64_t row0 =
      (static_cast<int64_t>(blockIdx.x) * kCoreWarpsPerBlock + (threadIdx.x >> 5)) * R;
  if (row0 >= n) return;
  const int64_t k8 = k / 8;
  const uint4* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = row0 + r < n ? row0 + r : n - 1;  // past n: dropped
    rows[r] = reinterpret_cast<const uint4*>(w + row * k);
  }
  float acc[M][R] = {};
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
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xf[8];
        Unpack(__ldg(reinterpret_cast<const uint4*>(x + m * x_stride) + i), xf);
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[m][r] = fmaf(xf[j], wf[r][j], acc[m][r]);
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) {
        acc[m][r] += __shfl_xor_sync(0xffffffffu, acc[m][r], offset);
      }
      if (lane == m * R + r && row0 + r < n) {
        Store<kF32Out>(acc[m][r], bias, y, y_stride, m, row0 + r, accumulate);
      }
    }
  }
}

// Launches `kernel` with programmatic dependent launch when `pdl` is set.
template <typename... Params, typename... Args>
cudaError_t LaunchKernel(void (*kernel)(Params...), unsigned blocks, unsigned threads, bool pdl,
                         cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl ? 1 : 0;
  cudaError_t error = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  if (error != cudaSuccess && pdl) {
    // Where the launch cannot take the attribute, a plain launch.
    (void)cudaGetLastError();
    config.numAttrs = 0;
    error = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  }
  return error;
}

template <int M>
cudaError_t LaunchCore(const void* x, int64_t x_stride, const void* w, const void* bias, void* y,
                       int64_t y_stride, int64_t n, int64_t k, bool f32_out, bool accumulate,
                       bool pdl, cudaStream_t stream) {
  const int64_t warps = (n + kCoreRows - 1) / kCoreRows;
  const unsigned blocks =
      static_cast<unsigned>((warps + kCoreWarpsPerBlock - 1) / kCoreWarpsPerBlock);
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const auto* wb = static_cast<const __nv_bfloat16*>(w);
  return LaunchKernel(f32_out ? GemvCoreKernel<M, true> : GemvCoreKernel<M, false>, blocks,
                      kCoreWarpsPerBlock * 32, pdl, stream, xb, x_stride, wb, bias, y, y_stride, n,
                      k, accumulate);
}

template <int NT, int KW, int U>
cudaError_t Launch(const void* x, int64_t x_stride, const void* w, const void* bias, void* y,
                   int64_t y_stride, int64_t m, int64_t n, int64_t k, bool f32_out,
                   bool accumulate, bool pdl, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  const auto* wb = static_cast<const __nv_bfloat16*>(w);
  return LaunchKernel(f32_out ? GemvKernel<NT, KW, U, true> : GemvKernel<NT, KW, U, false>, blocks,
                      KW * 32, pdl, stream, xb, x_stride, wb, bias, y, y_stride,
                      static_cast<int>(m), n, k, accumulate);
}

}  // namespace

cudaError_t GemvBf16(const void* x, int64_t x_stride, const void* w, const void* bias, void* y,
                     int64_t y_stride, int64_t m, int64_t n, int64_t k, bool f32_out,
                     bool accumulate, bool pdl, cudaStream_t stream) {
  if (m < 1 || m > kGemvMaxM) return cudaErrorInvalidValue;
  if (m == 1) {
    return LaunchCore<1>(x, x_stride, w, bias, y, y_stride, n, k, f32_out, accumulate, pdl, stream);
  }
  if (m == 2) {
    return LaunchCore<2>(x, x_stride, w, bias, y, y_stride, n, k, f32_out, accumulate, pdl, stream);
  }
  // Fewer 16-row blocks than a few per SM: more warps share each block's k.
  const bool few_rows = n <= 8192;
  if (m <= 8) {
    return few_rows ? Launch<1, 16, 4>(x, x_stride, w, bias, y, y_stride, m, n, k, f32_out,
                                       accumulate, pdl, stream)
                    : Launch<1, 8, 4>(x, x_stride, w, bias, y, y_stride, m, n, k, f32_out,
                                      accumulate, pdl, stream);
  }
  return few_rows ? Launch<2, 16, 2>(x, x_stride, w, bias, y, y_stride, m, n, k, f32_out,
                                     accumulate, pdl, stream)
                  : Launch<2, 8, 4>(x, x_stride, w, bias, y, y_stride, m, n, k, f32_out,
                                    accumulate, pdl, stream);
}

}  // namespace trident::kernels::cuda::internal
