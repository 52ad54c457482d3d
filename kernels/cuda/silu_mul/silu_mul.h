#ifndef TRIDENT_KERNELS_CUDA_SILU_MUL_SILU_MUL_H_
#define TRIDENT_KERNELS_CUDA_SILU_MUL_SILU_MUL_H_

// SwiGLU's activation on the GPU in bf16: out = silu(gate) * up, with the
// fused gate/up row layout of kernels/cpu/silu_mul (the reference).
// Arithmetic is in fp32; the input is bf16 or fp32 (a gate/up projection
// kept in fp32 so it is rounded only once, after the product), the output
// bf16. The kernel takes raw
// device pointers and a stream, never allocates and never synchronizes.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/numeric/dtype.h"

namespace trident::kernels::cuda {

struct SiluMulArgs {
  // Device pointer to num_tokens rows of 2 * hidden values of gate_up_dtype,
  // row stride gate_up_stride elements (>= 2 * hidden).
  const void* gate_up = nullptr;
  int64_t gate_up_stride = 0;
  // Device pointer to num_tokens rows of hidden bf16 values, row stride
  // out_stride elements (>= hidden).
  void* out = nullptr;
  int64_t out_stride = 0;
  int64_t num_tokens = 0;
  int64_t hidden = 0;
  // kBF16 or kF32.
  numeric::DType gate_up_dtype = numeric::DType::kBF16;
  // Launch with programmatic dependent launch (kernels/cuda/pdl): scheduled
  // before the kernel ahead of it ends, waiting for it before any load.
  bool pdl = false;
};

// Enqueues the kernel on `stream`. kInvalidArgument for negative sizes,
// strides smaller than a row, null pointers with rows to process, or hidden
// not a multiple of 2 (the kernel moves bf16 pairs); kInternal if the launch
// fails. Zero tokens is a no-op.
absl::Status LaunchSiluMul(const SiluMulArgs& args, cudaStream_t stream);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_SILU_MUL_SILU_MUL_H_
