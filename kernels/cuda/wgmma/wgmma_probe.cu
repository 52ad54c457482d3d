#include <cstdint>

#include "kernels/cuda/wgmma/wgmma_device.h"
#include "kernels/cuda/wgmma/wgmma_probe_kernel.h"

namespace trident::kernels::cuda::internal {
namespace {

constexpr int kMaxK = 128;
constexpr int kStepElems = 64 * 16;  // One 64 x 16 tile: 16 core matrices.

// Element (row, kk) of a 64 x k operand in the probe's layout: the tile of
// k step kk / 16, its core matrix (row / 8, kk % 16 / 8) at 64 elements per
// core matrix, K-adjacent ones next to each other, then row % 8 and kk % 8.
__device__ int LayoutIndex(int row, int kk) {
  return (kk / 16) * kStepElems + ((row / 8) * 2 + (kk % 16) / 8) * 64 + (row % 8) * 8 + kk % 8;
}

// Element (kk, n) of a k x 64 MN-major operand: core matrices of 8 K rows x
// 8 N values, K-adjacent ones next to each other as above.
__device__ int MnLayoutIndex(int kk, int n) {
  return (kk / 16) * kStepElems + ((n / 8) * 2 + (kk % 16) / 8) * 64 + (kk % 8) * 8 + n % 8;
}

// D = A B with A from registers and B (k x 64, N contiguous) MN-major.
// Writes a m64n64 accumulator fragment (wgmma_device's layout) to D, 64 x
// 64 row-major.
__device__ void StoreAccumulator(const float (&acc)[32], float* __restrict__ d) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row = 16 * warp + lane / 4;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int col = 8 * j + 2 * (lane % 4);
    d[row * 64 + col] = acc[4 * j];
    d[row * 64 + col + 1] = acc[4 * j + 1];
    d[(row + 8) * 64 + col] = acc[4 * j + 2];
    d[(row + 8) * 64 + col + 1] = acc[4 * j + 3];
  }
}

// Byte offsets in the 128-byte-swizzled layouts: K-major element (row, kk)
// of a 64 x k operand, 64-wide K atoms of 64 rows one after another; and
// MN-major element (kk, n) of a k x 64 operand, one atom along N.
__device__ int SwizzledKMajorByte(int row, int kk) {
  return (kk / 64) * 8192 + wgmma::Swizzle128Offset(row, (kk % 64) / 8) + (kk % 8) * 2;
}
__device__ int SwizzledMnMajorByte(int kk, int n) {
  return wgmma::Swizzle128Offset(kk, n / 8) + (n % 8) * 2;
}

__global__ void __launch_bounds__(128)
    WgmmaProbeRegAKernel(const uint16_t* __restrict__ a, const uint16_t* __restrict__ b, int k,
                         float* __restrict__ d, uint32_t leading_bytes, uint32_t stride_bytes,
                         bool swizzle) {
  __shared__ __align__(1024) uint16_t sb[64 * kMaxK];
  for (int i = threadIdx.x; i < 64 * k; i += blockDim.x) {
    const int at =
        swizzle ? SwizzledMnMajorByte(i / 64, i % 64) / 2 : MnLayoutIndex(i / 64, i % 64);
    sb[at] = b[i];
  }
  wgmma::FenceSharedForAsync();
  __syncthreads();
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int row = 16 * warp + lane / 4;
  float acc[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
  auto pair = [&](int r, int c) {
    return static_cast<uint32_t>(a[r * k + c]) | (static_cast<uint32_t>(a[r * k + c + 1]) << 16);
  };
  for (int s = 0; s < k / 16; ++s) {
    const int c = 16 * s + 2 * (lane % 4);
    const uint32_t frag[4] = {pair(row, c), pair(row + 8, c), pair(row, c + 8),
                              pair(row + 8, c + 8)};
    wgmma::Fence();
    // Swizzled: a k16 step is 16 rows of 128 bytes on.
    const uint64_t db =
        swizzle ? wgmma::Swizzle128Descriptor(sb + s * 16 * 64, stride_bytes)
                : wgmma::NoSwizzleDescriptor(sb + s * kStepElems, leading_bytes, stride_bytes);
    wgmma::MmaM64N64K16Bf16RegA(frag, db, acc, s > 0);
    wgmma::CommitGroup();
    wgmma::WaitGroup<0>();
  }
  StoreAccumulator(acc, d);
}

__global__ void __launch_bounds__(128)
    WgmmaProbeKernel(const uint16_t* __restrict__ a, const uint16_t* __restrict__ b, int k,
                     float* __restrict__ d, uint32_t leading_bytes, uint32_t stride_bytes,
                     bool swizzle) {
  __shared__ __align__(1024) uint16_t sa[64 * kMaxK];
  __shared__ __align__(1024) uint16_t sb[64 * kMaxK];
  for (int i = threadIdx.x; i < 64 * k; i += blockDim.x) {
    const int row = i / k;
    const int kk = i % k;
    const int at = swizzle ? SwizzledKMajorByte(row, kk) / 2 : LayoutIndex(row, kk);
    sa[at] = a[i];
    sb[at] = b[i];
  }
  wgmma::FenceSharedForAsync();
  __syncthreads();
  float acc[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
  wgmma::Fence();
  for (int s = 0; s < k / 16; ++s) {
    // Swizzled: k16 steps 32 bytes apart within a 64-wide atom.
    const int swizzled = (s / 4) * 4096 + (s % 4) * 16;  // In elements.
    const uint64_t da =
        swizzle ? wgmma::Swizzle128Descriptor(sa + swizzled, stride_bytes)
                : wgmma::NoSwizzleDescriptor(sa + s * kStepElems, leading_bytes, stride_bytes);
    const uint64_t db =
        swizzle ? wgmma::Swizzle128Descriptor(sb + swizzled, stride_bytes)
                : wgmma::NoSwizzleDescriptor(sb + s * kStepElems, leading_bytes, stride_bytes);
    wgmma::MmaM64N64K16Bf16(da, db, acc, s > 0);
  }
  wgmma::CommitGroup();
  wgmma::WaitGroup<0>();
  StoreAccumulator(acc, d);
}

}  // namespace

cudaError_t WgmmaProbe(const uint16_t* a, const uint16_t* b, int32_t k, float* d,
                       uint32_t leading_bytes, uint32_t stride_bytes, bool register_a, bool swizzle,
                       cudaStream_t stream) {
  if (register_a) {
    WgmmaProbeRegAKernel<<<1, 128, 0, stream>>>(a, b, k, d, leading_bytes, stride_bytes, swizzle);
  } else {
    WgmmaProbeKernel<<<1, 128, 0, stream>>>(a, b, k, d, leading_bytes, stride_bytes, swizzle);
  }
  return cudaGetLastError();
}

}  // namespace trident::kernels::cuda::internal
