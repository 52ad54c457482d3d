#ifndef TRIDENT_KERNELS_CUDA_SAMPLING_SAMPLING_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_SAMPLING_SAMPLING_KERNEL_H_

// The launcher nvcc compiles; sampling.cc checks arguments before calling it.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/sampling/sampling_row.h"

namespace trident::kernels::cuda::internal {

// Floats per workspace row: vocab rounded up to 16-byte multiples.
constexpr int64_t SampleWorkspaceRowFloats(int32_t vocab) { return (int64_t{vocab} + 3) / 4 * 4; }

struct SampleKernelArgs {
  const void* logits;
  bool logits_bf16;
  int64_t logits_stride;
  int32_t vocab;
  const SamplingRow* params;
  const int32_t* seen_tokens;
  const SamplingTokenCount* output_counts;
  int32_t* tokens;
  float* logprobs;
  int32_t max_top_logprobs;
  int32_t* top_ids;
  float* top_logprobs;
  float* workspace;          // [rows][SampleWorkspaceRowFloats(vocab)]
  bool greedy_only = false;  // SampleArgs::greedy_only
};

cudaError_t Sample(const SampleKernelArgs& args, int64_t rows, cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_SAMPLING_SAMPLING_KERNEL_H_
