#include <cstdint>

#include "kernels/cuda/testing/read_ceiling.h"

namespace trident::kernels::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;

__global__ void __launch_bounds__(kThreads)
    ReadCeilingKernel(const uint4* __restrict__ data, int64_t count, unsigned* sink) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  unsigned acc = 0;
  for (; i + (kUnroll - 1) * stride < count; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldg(data + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < count; i += stride) {
    const uint4 v = __ldg(data + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // Keeps the loads; practically never taken.
}

}  // namespace

cudaError_t LaunchReadCeiling(const void* data, size_t bytes, unsigned* sink, cudaStream_t stream) {
  int device = 0;
  int sms = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error == cudaSuccess) {
    error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (error != cudaSuccess) return error;
  ReadCeilingKernel<<<static_cast<unsigned>(sms * 4), kThreads, 0, stream>>>(
      static_cast<const uint4*>(data), static_cast<int64_t>(bytes / 16), sink);
  return cudaGetLastError();
}

}  // namespace trident::kernels::cuda
