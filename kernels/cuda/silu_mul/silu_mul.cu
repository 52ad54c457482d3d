#include <cuda_bf16.h>

#include "kernels/cuda/pdl/pdl_device.h"
#include "kernels/cuda/silu_mul/silu_mul_kernel.h"

namespace trident::kernels::cuda::internal {
namespace {

// Blocks (token, y) cover a token row's pairs y * blockDim.x + threadIdx.x,
// + gridDim.y * blockDim.x, ...: one row spreads over several SMs (a single
// decode token's 7168 pairs over 28 blocks). Each thread handles bf16 pairs
// so loads and stores are 4-byte wide. The op is memory-bound: 6 bytes moved
// per output element, so the goal is the copy bandwidth of the card.
__global__ void SiluMulBf16Kernel(const __nv_bfloat162* __restrict__ gate_up,
                                  int64_t gate_up_stride_pairs, __nv_bfloat162* __restrict__ out,
                                  int64_t out_stride_pairs, int64_t hidden_pairs) {
  // A projection launched after this kernel with programmatic dependent
  // launch may start loading its weights now (it waits for this grid to end
  // before it reads this kernel's output); launched so itself, this kernel
  // waits for the one ahead before its first load.
  pdl::LetDependentsLaunchThenWait();
  const int64_t token = blockIdx.x;
  const __nv_bfloat162* gate = gate_up + token * gate_up_stride_pairs;
  const __nv_bfloat162* up = gate + hidden_pairs;
  __nv_bfloat162* row = out + token * out_stride_pairs;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < hidden_pairs;
       i += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    const float2 g = __bfloat1622float2(gate[i]);
    const float2 u = __bfloat1622float2(up[i]);
    const float x = g.x / (1.0f + __expf(-g.x)) * u.x;
    const float y = g.y / (1.0f + __expf(-g.y)) * u.y;
    row[i] = __floats2bfloat162_rn(x, y);
  }
}

// The same over fp32 inputs, as float2 pairs.
__global__ void SiluMulF32Kernel(const float2* __restrict__ gate_up, int64_t gate_up_stride_pairs,
                                 __nv_bfloat162* __restrict__ out, int64_t out_stride_pairs,
                                 int64_t hidden_pairs) {
  pdl::LetDependentsLaunchThenWait();  // As above.
  const int64_t token = blockIdx.x;
  const float2* gate = gate_up + token * gate_up_stride_pairs;
  const float2* up = gate + hidden_pairs;
  __nv_bfloat162* row = out + token * out_stride_pairs;
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < hidden_pairs;
       i += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    const float2 g = gate[i];
    const float2 u = up[i];
    const float x = g.x / (1.0f + __expf(-g.x)) * u.x;
    const float y = g.y / (1.0f + __expf(-g.y)) * u.y;
    row[i] = __floats2bfloat162_rn(x, y);
  }
}

}  // namespace

cudaError_t SiluMulBf16(const void* gate_up, int64_t gate_up_stride, bool f32_in, void* out,
                        int64_t out_stride, int64_t num_tokens, int64_t hidden, bool pdl,
                        cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  const int64_t hidden_pairs = hidden / 2;
  const int threads = hidden_pairs >= 256 ? 256 : static_cast<int>((hidden_pairs + 31) / 32 * 32);
  const int64_t column_blocks = (hidden_pairs + threads - 1) / threads;
  const dim3 grid(static_cast<unsigned>(num_tokens),
                  static_cast<unsigned>(column_blocks < 65535 ? column_blocks : 65535));
  if (f32_in) {
    return pdl::Launch(&SiluMulF32Kernel, grid, dim3(threads), 0, stream, pdl,
                       static_cast<const float2*>(gate_up), gate_up_stride / 2,
                       static_cast<__nv_bfloat162*>(out), out_stride / 2, hidden_pairs);
  }
  return pdl::Launch(&SiluMulBf16Kernel, grid, dim3(threads), 0, stream, pdl,
                     static_cast<const __nv_bfloat162*>(gate_up), gate_up_stride / 2,
                     static_cast<__nv_bfloat162*>(out), out_stride / 2, hidden_pairs);
}

}  // namespace trident::kernels::cuda::internal
