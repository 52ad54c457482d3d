#include <cuda_bf16.h>

#include <cstdint>

#include "common/numeric/counter_stream.h"
#include "kernels/cuda/random_fill/random_fill_kernel.h"

namespace trident::kernels::cuda::internal {
namespace {

constexpr int kThreads = 256;
constexpr int kGroup = 8;  // Elements a thread computes: one 16-byte store.

__device__ uint16_t Value(const RandomFillParams& p, const uint8_t* quarter_rows, int64_t r,
                          int64_t c) {
  const uint64_t i = static_cast<uint64_t>((p.row0 + r) * p.tensor_cols + p.col0 + c);
  float v = numeric::StreamUniform(p.base, i, p.mean, p.half_width);
  if (quarter_rows != nullptr && quarter_rows[r] != 0) v = __fmul_rn(v, 0.25f);
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));  // numeric::FloatToBf16's rounding.
}

// Thread g computes elements [8 g, 8 g + 8) of the block, row-major (a
// group may span rows), and stores them at once where `out` is 16-byte
// aligned, one by one otherwise and at the ragged end.
__global__ void __launch_bounds__(kThreads)
    RandomFillKernel(RandomFillParams p, const uint8_t* __restrict__ quarter_rows,
                     uint16_t* __restrict__ out, bool aligned) {
  const int64_t total = p.rows * p.cols;
  const int64_t groups = (total + kGroup - 1) / kGroup;
  for (int64_t g = int64_t{blockIdx.x} * kThreads + threadIdx.x; g < groups;
       g += int64_t{gridDim.x} * kThreads) {
    const int64_t first = g * kGroup;
    int64_t r = first / p.cols;
    int64_t c = first - r * p.cols;
    uint16_t v[kGroup];
    const int n = total - first < kGroup ? static_cast<int>(total - first) : kGroup;
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      if (k < n) v[k] = Value(p, quarter_rows, r, c);
      if (++c == p.cols) {
        c = 0;
        ++r;
      }
    }
    if (aligned && n == kGroup) {
      uint4 word;
      word.x = v[0] | (uint32_t{v[1]} << 16);
      word.y = v[2] | (uint32_t{v[3]} << 16);
      word.z = v[4] | (uint32_t{v[5]} << 16);
      word.w = v[6] | (uint32_t{v[7]} << 16);
      *reinterpret_cast<uint4*>(out + first) = word;
    } else {
      for (int k = 0; k < n; ++k) out[first + k] = v[k];
    }
  }
}

}  // namespace

cudaError_t RandomFillBf16(const RandomFillParams& params, const uint8_t* quarter_rows,
                           uint16_t* out, cudaStream_t stream) {
  const int64_t groups = (params.rows * params.cols + kGroup - 1) / kGroup;
  const int64_t blocks = (groups + kThreads - 1) / kThreads;
  // Enough CTAs to fill any device several times over; larger blocks loop.
  const unsigned grid = static_cast<unsigned>(blocks < 4096 ? blocks : 4096);
  const bool aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0;
  RandomFillKernel<<<grid, kThreads, 0, stream>>>(params, quarter_rows, out, aligned);
  return cudaGetLastError();
}

}  // namespace trident::kernels::cuda::internal
