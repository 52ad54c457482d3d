#ifndef TRIDENT_COMMON_BACKEND_CUDA_SAMPLING_BATCH_H_
#define TRIDENT_COMMON_BACKEND_CUDA_SAMPLING_BATCH_H_

// Builds the host-side arrays of one GPU sampling launch (SampleArgs in
// kernels/cuda/sampling/sampling.h) from the CPU sampler's types: one
// SamplingRow per sequence plus the CSR penalty arrays the rows index. The
// caller stages rows(), seen_tokens() and output_counts() in pinned memory
// and copies each to the device once per step. Plain C++: builds without
// CUDA.

#include <cstdint>
#include <vector>

#include "common/sampling/sampler.h"
#include "common/sampling/sampling_params.h"
#include "kernels/cuda/sampling/sampling_row.h"

namespace trident::backend {

// Thread-compatible. Reuses its vectors' capacity across Clear() calls.
class SamplingBatchBuilder {
 public:
  // Forgets every row, keeping the capacity.
  void Clear();

  // Appends the row that samples output position `output_position` of a
  // sequence with `params` and `penalties`. Penalty lists are copied only when
  // the matching penalty is on (repetition_penalty != 1 for seen tokens;
  // frequency or presence penalty != 0 for output counts), so rows without
  // penalties cost no CSR entries. Ids outside the vocabulary are copied
  // as they are; the kernel ignores them, as the CPU sampler does.
  void Add(const sampling::SamplingParams& params, const sampling::PenaltyState& penalties,
           int64_t output_position);

  const std::vector<kernels::cuda::SamplingRow>& rows() const { return rows_; }
  const std::vector<int32_t>& seen_tokens() const { return seen_tokens_; }
  const std::vector<kernels::cuda::SamplingTokenCount>& output_counts() const {
    return output_counts_;
  }
  int64_t num_rows() const { return static_cast<int64_t>(rows_.size()); }
  // The largest top_logprobs of any row: SampleArgs::max_top_logprobs.
  int32_t max_top_logprobs() const { return max_top_logprobs_; }
  // Whether any row asks for logprobs (then SampleArgs::logprobs is needed).
  bool any_logprobs() const { return any_logprobs_; }
  // Whether every row is greedy with no penalty list and no logprobs:
  // SampleArgs::greedy_only.
  bool greedy_only() const { return greedy_only_; }

 private:
  std::vector<kernels::cuda::SamplingRow> rows_;
  std::vector<int32_t> seen_tokens_;
  std::vector<kernels::cuda::SamplingTokenCount> output_counts_;
  int32_t max_top_logprobs_ = 0;
  bool any_logprobs_ = false;
  bool greedy_only_ = true;
};

// The row for one sequence with its CSR ranges empty: the parameter mapping
// Add uses.
kernels::cuda::SamplingRow MakeSamplingRow(const sampling::SamplingParams& params,
                                           int64_t output_position);

}  // namespace trident::backend

#endif  // TRIDENT_COMMON_BACKEND_CUDA_SAMPLING_BATCH_H_
