#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/pdl/pdl_device.h"
#include "kernels/cuda/rms_norm/rms_norm_device.h"
#include "kernels/cuda/rms_norm/rms_norm_kernel.h"

namespace trident::kernels::cuda::internal {
namespace {

// bf16 values travel as their uint16_t bits: widening is exact (a shift),
// narrowing rounds to nearest even.
__device__ __forceinline__ float Bf16BitsToFloat(uint32_t bits) {
  return __uint_as_float(bits << 16);
}
__device__ __forceinline__ uint32_t FloatToBf16Bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// Loads VEC (4 or 1) consecutive values as floats.
template <int VEC>
__device__ __forceinline__ void Load(const float* p, float* v) {
  if constexpr (VEC == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x;
    v[1] = t.y;
    v[2] = t.z;
    v[3] = t.w;
  } else {
    v[0] = *p;
  }
}
template <int VEC>
__device__ __forceinline__ void Load(const uint16_t* p, float* v) {
  if constexpr (VEC == 4) {
    const uint2 t = *reinterpret_cast<const uint2*>(p);
    v[0] = Bf16BitsToFloat(t.x & 0xffffu);
    v[1] = Bf16BitsToFloat(t.x >> 16);
    v[2] = Bf16BitsToFloat(t.y & 0xffffu);
    v[3] = Bf16BitsToFloat(t.y >> 16);
  } else {
    v[0] = Bf16BitsToFloat(*p);
  }
}

template <int VEC>
__device__ __forceinline__ void Store(float* p, const float* v) {
  if constexpr (VEC == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    *p = v[0];
  }
}
template <int VEC>
__device__ __forceinline__ void StoreBf16(uint16_t* p, const float* v) {
  if constexpr (VEC == 4) {
    uint2 t;
    t.x = FloatToBf16Bits(v[0]) | (FloatToBf16Bits(v[1]) << 16);
    t.y = FloatToBf16Bits(v[2]) | (FloatToBf16Bits(v[3]) << 16);
    *reinterpret_cast<uint2*>(p) = t;
  } else {
    *p = static_cast<uint16_t>(FloatToBf16Bits(v[0]));
  }
}

// The sum of `v` over the block, returned to every thread. blockDim.x must be
// a multiple of 32 (at most 1024). Called once per kernel.
__device__ float BlockSum(float v) {
  __shared__ float warp_sums[32];
  __shared__ float total;
  v = rms_norm::WarpButterflySum(v);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int num_warps = blockDim.x / 32;
    const float s = rms_norm::WarpButterflySum(lane < num_warps ? warp_sums[lane] : 0.0f);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

using rms_norm::InverseRms;

// Writes out = weight * (x * r) for the elements this thread owns (the same
// ones it read in the first pass, so `out` may alias the input).
template <int VEC, typename XT>
__device__ __forceinline__ void ScaleRow(const XT* x, const float* weight, float r, int64_t dim,
                                         uint16_t* out) {
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * VEC; i < dim;
       i += static_cast<int64_t>(blockDim.x) * VEC) {
    float v[VEC];
    float w[VEC];
    float y[VEC];
    Load<VEC>(x + i, v);
    Load<VEC>(weight + i, w);
#pragma unroll
    for (int j = 0; j < VEC; ++j) y[j] = rms_norm::Scaled(v[j], w[j], r);
    StoreBf16<VEC>(out + i, y);
  }
}

// One block per row. XT is float or uint16_t (bf16 bits).
template <int VEC, typename XT>
__global__ void RmsNormKernel(const XT* x, int64_t x_stride, const float* __restrict__ weight,
                              uint16_t* out, int64_t out_stride, int64_t dim, float eps) {
  // A projection launched after this kernel with programmatic dependent
  // launch may start loading its weights now (it waits for this grid to end
  // before it reads this kernel's output); launched so itself, this kernel
  // waits for the one ahead before its first load.
  pdl::LetDependentsLaunchThenWait();
  const int64_t row = blockIdx.x;
  const XT* x_row = x + row * x_stride;
  float sum = 0.0f;
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * VEC; i < dim;
       i += static_cast<int64_t>(blockDim.x) * VEC) {
    float v[VEC];
    Load<VEC>(x_row + i, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum = fmaf(v[j], v[j], sum);
  }
  const float r = InverseRms(BlockSum(sum), dim, eps);
  ScaleRow<VEC>(x_row, weight, r, dim, out + row * out_stride);
}

template <int VEC>
__global__ void AddRmsNormKernel(float* residual, int64_t residual_stride, const uint16_t* delta,
                                 int64_t delta_stride, bool replace_residual,
                                 const float* __restrict__ weight, uint16_t* out,
                                 int64_t out_stride, int64_t dim, float eps) {
  // A projection launched after this kernel with programmatic dependent
  // launch may start loading its weights now (it waits for this grid to end
  // before it reads this kernel's output); launched so itself, this kernel
  // waits for the one ahead before its first load.
  pdl::LetDependentsLaunchThenWait();
  const int64_t row = blockIdx.x;
  float* res_row = residual + row * residual_stride;
  const uint16_t* delta_row = delta + row * delta_stride;
  float sum = 0.0f;
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * VEC; i < dim;
       i += static_cast<int64_t>(blockDim.x) * VEC) {
    float d[VEC];
    float h[VEC];
    Load<VEC>(delta_row + i, d);
    if (replace_residual) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) h[j] = d[j];
    } else {
      Load<VEC>(res_row + i, h);
#pragma unroll
      for (int j = 0; j < VEC; ++j) h[j] = __fadd_rn(h[j], d[j]);
    }
    Store<VEC>(res_row + i, h);
#pragma unroll
    for (int j = 0; j < VEC; ++j) sum = fmaf(h[j], h[j], sum);
  }
  const float r = InverseRms(BlockSum(sum), dim, eps);
  // Each thread rereads only the residual elements it wrote itself.
  ScaleRow<VEC>(static_cast<const float*>(res_row), weight, r, dim, out + row * out_stride);
}

}  // namespace

cudaError_t RmsNormBf16Out(const void* x, bool x_is_bf16, int64_t x_stride, const float* weight,
                           void* out, int64_t out_stride, int64_t rows, int64_t dim, float eps,
                           bool vectorized, bool pdl, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const dim3 blocks(static_cast<unsigned>(rows));
  uint16_t* o = static_cast<uint16_t*>(out);
  const dim3 threads(rms_norm::BlockThreads(vectorized ? dim / 4 : dim));
  if (x_is_bf16) {
    const uint16_t* xb = static_cast<const uint16_t*>(x);
    return pdl::Launch(vectorized ? &RmsNormKernel<4, uint16_t> : &RmsNormKernel<1, uint16_t>,
                       blocks, threads, 0, stream, pdl, xb, x_stride, weight, o, out_stride, dim,
                       eps);
  }
  const float* xf = static_cast<const float*>(x);
  return pdl::Launch(vectorized ? &RmsNormKernel<4, float> : &RmsNormKernel<1, float>, blocks,
                     threads, 0, stream, pdl, xf, x_stride, weight, o, out_stride, dim, eps);
}

cudaError_t AddRmsNormBf16Out(float* residual, int64_t residual_stride, const void* delta,
                              int64_t delta_stride, bool replace_residual, const float* weight,
                              void* out, int64_t out_stride, int64_t rows, int64_t dim, float eps,
                              bool vectorized, bool pdl, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const dim3 blocks(static_cast<unsigned>(rows));
  const uint16_t* d = static_cast<const uint16_t*>(delta);
  uint16_t* o = static_cast<uint16_t*>(out);
  return pdl::Launch(vectorized ? &AddRmsNormKernel<4> : &AddRmsNormKernel<1>, blocks,
                     dim3(rms_norm::BlockThreads(vectorized ? dim / 4 : dim)), 0, stream, pdl,
                     residual, residual_stride, d, delta_stride, replace_residual, weight, o,
                     out_stride, dim, eps);
}

}  // namespace trident::kernels::cuda::internal
