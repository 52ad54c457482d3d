#include "common/backend/cuda/sampling_batch.h"

#include <algorithm>

namespace trident::backend {

using ::trident::kernels::cuda::SamplingRow;

SamplingRow MakeSamplingRow(const sampling::SamplingParams& params, int64_t output_position) {
  SamplingRow row;
  row.temperature = params.temperature;
  row.top_p = params.top_p;
  row.min_p = params.min_p;
  row.repetition_penalty = params.repetition_penalty;
  row.presence_penalty = params.presence_penalty;
  row.frequency_penalty = params.frequency_penalty;
  row.top_k = params.top_k;
  row.top_logprobs = params.top_logprobs;
  row.logprobs = params.logprobs || params.top_logprobs > 0;
  row.seed = params.seed;
  row.output_position = output_position;
  return row;
}

void SamplingBatchBuilder::Clear() {
  rows_.clear();
  seen_tokens_.clear();
  output_counts_.clear();
  max_top_logprobs_ = 0;
  any_logprobs_ = false;
  greedy_only_ = true;
}

void SamplingBatchBuilder::Add(const sampling::SamplingParams& params,
                               const sampling::PenaltyState& penalties, int64_t output_position) {
  SamplingRow row = MakeSamplingRow(params, output_position);
  row.seen_begin = static_cast<int32_t>(seen_tokens_.size());
  if (params.repetition_penalty != 1.0f) {
    const auto seen = penalties.seen_tokens();
    seen_tokens_.insert(seen_tokens_.end(), seen.begin(), seen.end());
  }
  row.seen_end = static_cast<int32_t>(seen_tokens_.size());
  row.counts_begin = static_cast<int32_t>(output_counts_.size());
  if (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) {
    for (const auto& [token, count] : penalties.output_counts()) {
      output_counts_.push_back({token, count});
    }
  }
  row.counts_end = static_cast<int32_t>(output_counts_.size());
  max_top_logprobs_ = std::max(max_top_logprobs_, row.top_logprobs);
  any_logprobs_ = any_logprobs_ || row.logprobs;
  greedy_only_ = greedy_only_ && row.temperature == 0.0f && !row.logprobs &&
                 row.seen_end == row.seen_begin && row.counts_end == row.counts_begin;
  rows_.push_back(row);
}

}  // namespace trident::backend
