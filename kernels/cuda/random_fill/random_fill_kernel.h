#ifndef TRIDENT_KERNELS_CUDA_RANDOM_FILL_RANDOM_FILL_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_RANDOM_FILL_RANDOM_FILL_KERNEL_H_

// The launcher nvcc compiles; random_fill.cc checks arguments first.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trident::kernels::cuda::internal {

struct RandomFillParams {
  uint64_t base;
  float mean;
  float half_width;
  int64_t tensor_cols;
  int64_t row0;
  int64_t col0;
  int64_t rows;
  int64_t cols;
};

cudaError_t RandomFillBf16(const RandomFillParams& params, const uint8_t* quarter_rows,
                           uint16_t* out, cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_RANDOM_FILL_RANDOM_FILL_KERNEL_H_
