#ifndef TRIDENT_KERNELS_CUDA_GEMM_GEMV_DEVICE_H_
#define TRIDENT_KERNELS_CUDA_GEMM_GEMV_DEVICE_H_

// The pieces both single-row GEMV kernels share (nvcc only): unpacking eight
// bf16 weights or activations, and the epilogue that writes one output.

#include <cuda_bf16.h>

#include <cstdint>

namespace trident::kernels::cuda::internal {

// Eight bf16 values, as 16 bytes, to floats.
__device__ __forceinline__ void Unpack(const uint4& v, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// acc += the dot product of eight weights and eight activations.
__device__ __forceinline__ float Dot8(const uint4& w, const uint4& x, float acc) {
  float wf[8], xf[8];
  Unpack(w, wf);
  Unpack(x, xf);
#pragma unroll
  for (int j = 0; j < 8; ++j) acc = fmaf(xf[j], wf[j], acc);
  return acc;
}

// An output row's bias and (with `accumulate`) y's old value, as floats:
// loadable ahead of the row's sum, so its store then waits for no load.
struct RowInputs {
  float bias = 0.0f;
  float y = 0.0f;
};

template <bool kF32Out>
__device__ __forceinline__ RowInputs LoadRowInputs(const void* bias, const void* y, int64_t row,
                                                   bool accumulate) {
  RowInputs in;
  if constexpr (kF32Out) {
    if (bias != nullptr) in.bias = static_cast<const float*>(bias)[row];
    if (accumulate) in.y = static_cast<const float*>(y)[row];
  } else {
    if (bias != nullptr) in.bias = __bfloat162float(static_cast<const __nv_bfloat16*>(bias)[row]);
    if (accumulate) in.y = __bfloat162float(static_cast<const __nv_bfloat16*>(y)[row]);
  }
  return in;
}

// Adds the bias (and y's old value with `accumulate`), in that order, and
// writes y[row].
template <bool kF32Out>
__device__ __forceinline__ void StoreRow(float v, const RowInputs& in, bool has_bias, void* y,
                                         int64_t row, bool accumulate) {
  if (has_bias) v += in.bias;
  if (accumulate) v += in.y;
  if constexpr (kF32Out) {
    static_cast<float*>(y)[row] = v;
  } else {
    static_cast<__nv_bfloat16*>(y)[row] = __float2bfloat16_rn(v);
  }
}

// StoreRow with the inputs loaded now.
template <bool kF32Out>
__device__ __forceinline__ void Store(float v, const void* bias, void* y, int64_t row,
                                      bool accumulate) {
  StoreRow<kF32Out>(v, LoadRowInputs<kF32Out>(bias, y, row, accumulate), bias != nullptr, y, row,
                    accumulate);
}

// The sum of a warp's 32 partial sums, in every lane.
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_GEMM_GEMV_DEVICE_H_
