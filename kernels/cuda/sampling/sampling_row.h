#ifndef TRIDENT_KERNELS_CUDA_SAMPLING_SAMPLING_ROW_H_
#define TRIDENT_KERNELS_CUDA_SAMPLING_SAMPLING_ROW_H_

// The per-row parameters of the GPU sampler (kernels/cuda/sampling/sampling.h)
// as plain structs: the host builds them (the CUDA backend, from the engine's
// sampling parameters: common/backend/cuda/sampling_batch.h), copies them to
// the device byte for byte, and the kernel reads them there. No CUDA header
// is needed to build or fill them.

#include <cstdint>
#include <type_traits>

namespace trident::kernels::cuda {

// One row of a sampling launch: trident::sampling::SamplingParams plus the
// row's output position and its ranges in the batch's CSR penalty arrays.
// Field meanings are those of SamplingParams (common/sampling/sampling_params.h).
struct SamplingRow {
  float temperature = 1.0f;  // 0 = greedy.
  float top_p = 1.0f;        // In (0, 1]; 1 = off.
  float min_p = 0.0f;        // In [0, 1]; 0 = off.
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t top_k = 0;         // 0 = off.
  int32_t top_logprobs = 0;  // In [0, kMaxSampleTopLogprobs]; > 0 implies logprobs.
  bool logprobs = false;
  uint64_t seed = 0;
  // Output position of the token being sampled (0 for the first generated
  // token): the Philox counter of the draw.
  int64_t output_position = 0;
  // [seen_begin, seen_end) indexes SampleArgs::seen_tokens: the distinct
  // prompt and output tokens, for the repetition penalty.
  int32_t seen_begin = 0;
  int32_t seen_end = 0;
  // [counts_begin, counts_end) indexes SampleArgs::output_counts: (token,
  // count) of each distinct output token, for frequency and presence penalties.
  int32_t counts_begin = 0;
  int32_t counts_end = 0;
};

// (token, count in output). Same size and alignment as CUDA's int2.
struct alignas(8) SamplingTokenCount {
  int32_t token = 0;
  int32_t count = 0;
};

static_assert(std::is_trivially_copyable_v<SamplingRow>);
static_assert(std::is_standard_layout_v<SamplingRow>);
static_assert(sizeof(SamplingRow) == 72);
static_assert(std::is_trivially_copyable_v<SamplingTokenCount>);
static_assert(sizeof(SamplingTokenCount) == 8);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_SAMPLING_SAMPLING_ROW_H_
