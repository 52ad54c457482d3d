#ifndef TRIDENT_KERNELS_CUDA_RMS_NORM_RMS_NORM_H_
#define TRIDENT_KERNELS_CUDA_RMS_NORM_RMS_NORM_H_

// RMSNorm and the fused residual add + RMSNorm on the GPU, with the semantics
// of kernels/cpu/rms_norm (the reference):
//
//   RmsNorm:     out[r, :] = weight * (x[r, :] * rsqrt(mean(x[r, :]^2) + eps))
//   AddRmsNorm:  residual[r, :] = residual[r, :] + delta[r, :]
//                out[r, :]      = RmsNorm(residual[r, :])
//
// Precision choices:
// - The residual stream (the hidden state between layers) is kept in fp32
//   (`float* residual`), as the CPU backend keeps it: adding bf16 layer
//   outputs into a bf16 residual would lose 8 bits per layer. The add is one
//   fp32 addition of the widened bf16 delta, so the updated residual is
//   bit-identical to the CPU's on the same inputs.
// - Weights are fp32 (converted from the checkpoint's bf16 once, at load).
// - delta and out are bf16; out is rounded to nearest even from fp32 math.
// - The sum of squares is an fp32 tree reduction (order differs from the
//   CPU's); the scaling is weight * (x * r), each product rounded on its own.
//
// One thread block per row; 16-byte (fp32) / 8-byte (bf16) loads when dim and
// strides are multiples of 4 and the pointers aligned, scalar otherwise. The
// kernels take raw device pointers and a stream, never allocate and never
// synchronize.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/numeric/dtype.h"

namespace trident::kernels::cuda {

struct RmsNormArgs {
  // Device pointer to rows of dim values of x_dtype (kF32, e.g. the fp32
  // residual stream, or kBF16), row stride x_stride elements (>= dim).
  const void* x = nullptr;
  numeric::DType x_dtype = numeric::DType::kF32;
  int64_t x_stride = 0;
  // Device pointer to dim fp32 weights.
  const float* weight = nullptr;
  // Device pointer to rows of dim bf16 values, row stride out_stride (>= dim).
  // May be x itself (bf16 x with the same stride); otherwise no overlap.
  void* out = nullptr;
  int64_t out_stride = 0;
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 1e-5f;
  // Launch with programmatic dependent launch (kernels/cuda/pdl): scheduled
  // before the kernel ahead of it ends, waiting for it before any load.
  bool pdl = false;
};

struct AddRmsNormArgs {
  // Device pointer to rows of dim fp32 values, updated in place; row stride
  // residual_stride elements (>= dim).
  float* residual = nullptr;
  int64_t residual_stride = 0;
  // Device pointer to rows of dim bf16 values added to the residual.
  const void* delta = nullptr;
  int64_t delta_stride = 0;
  // When true the residual's old contents are ignored and it is set to delta
  // (the first layer: residual = embedding output), i.e. as if it were zero.
  bool replace_residual = false;
  // Device pointer to dim fp32 weights.
  const float* weight = nullptr;
  // Device pointer to rows of dim bf16 values, row stride out_stride (>= dim).
  // May be delta itself (same stride); must not overlap residual.
  void* out = nullptr;
  int64_t out_stride = 0;
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 1e-5f;
  // Launch with programmatic dependent launch (kernels/cuda/pdl): scheduled
  // before the kernel ahead of it ends, waiting for it before any load.
  bool pdl = false;
};

// Enqueue the kernel on `stream`. kInvalidArgument naming the field for
// negative rows, non-positive dim, strides smaller than dim, eps negative or
// not finite, an x_dtype other than kF32 or kBF16, or null pointers with rows
// to process; kInternal if the launch fails. Zero rows is a no-op.
absl::Status LaunchRmsNorm(const RmsNormArgs& args, cudaStream_t stream);
absl::Status LaunchAddRmsNorm(const AddRmsNormArgs& args, cudaStream_t stream);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_RMS_NORM_RMS_NORM_H_
