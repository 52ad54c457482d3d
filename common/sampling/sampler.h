#ifndef TRIDENT_COMMON_SAMPLING_SAMPLER_H_
#define TRIDENT_COMMON_SAMPLING_SAMPLER_H_

// The CPU sampler: turns one position's logits into a token, as
// trident.v1.SamplingParams documents. It is also the executable spec of a
// later GPU sampler.
//
// Pipeline (vLLM's order), on a private copy of the logits:
//   1. repetition penalty over every distinct prompt and output token:
//      positive logits divided by it, others multiplied;
//   2. frequency penalty (times the token's output count), then presence
//      penalty (once), subtracted for every token present in the output;
//   3. temperature == 0: greedy argmax, lowest id on ties. Otherwise:
//   4. logits divided by temperature; weights w = exp(x - max x), so the most
//      likely token has weight exactly 1;
//   5. top_k: keep the k largest weights (ties broken by lower id);
//   6. top_p: over what is left, sorted by weight descending (ties by lower
//      id), keep each token whose preceding mass is < top_p * total mass:
//      the smallest prefix reaching top_p, and never nothing;
//   7. min_p: keep tokens with w >= min_p (= min_p times the top probability);
//   8. draw u = UniformFromPhilox(seed, output_position) and walk the kept
//      tokens in ascending id order, accumulating weights; the first token
//      whose running sum exceeds u * (sum of kept weights) is the sample.
// NaN logits count as -inf. If every logit is -inf (or NaN), token 0 is
// returned.
//
// Logprobs are those of the model's own distribution: log_softmax of the raw
// logits, before penalties, temperature and truncation (generation.proto's
// TokenLogprobs).

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "common/sampling/sampling_params.h"

namespace trident::sampling {

// The token counts of one sequence that penalties need: the distinct tokens
// of prompt and output (repetition penalty) and each output token's count
// (frequency and presence penalties). Costs O(distinct tokens) memory;
// updates are O(1). Iteration orders are first-seen orders, so penalties are
// applied deterministically.
//
// Thread-compatible.
class PenaltyState {
 public:
  PenaltyState() = default;
  explicit PenaltyState(absl::Span<const int32_t> prompt_tokens) { AddPromptTokens(prompt_tokens); }

  void AddPromptTokens(absl::Span<const int32_t> tokens);
  // Records a sampled token.
  void AddOutputToken(int32_t token);

  // Distinct tokens of prompt and output, in first-seen order.
  absl::Span<const int32_t> seen_tokens() const { return seen_tokens_; }
  // (token, count in output) for each distinct output token, first-seen order.
  absl::Span<const std::pair<int32_t, int32_t>> output_counts() const { return output_counts_; }
  int32_t OutputCount(int32_t token) const;
  int32_t num_output_tokens() const { return num_output_tokens_; }

 private:
  // Value: index into output_counts_, or -1 for a token only in the prompt.
  absl::flat_hash_map<int32_t, int32_t> index_;
  std::vector<int32_t> seen_tokens_;
  std::vector<std::pair<int32_t, int32_t>> output_counts_;
  int32_t num_output_tokens_ = 0;
};

struct SampledToken {
  int32_t token = 0;
  // log_softmax(raw logits)[token]; 0 unless params.logprobs or
  // params.top_logprobs > 0.
  float logprob = 0.0f;
  // The params.top_logprobs most likely (token, logprob) pairs of the raw
  // distribution, most likely first (ties: lower id first).
  std::vector<std::pair<int32_t, float>> top_logprobs;
};

// Applies steps 1 and 2 above to `logits` in place. Token ids in `state`
// outside [0, logits.size()) are ignored.
void ApplyPenalties(absl::Span<float> logits, const SamplingParams& params,
                    const PenaltyState& state);

// Samples tokens, reusing its scratch buffers across calls (no allocation
// once they have grown to the vocabulary size). Every step is O(V) for a
// vocabulary of V tokens, plus O(k log k) for top_k combined with top_p and
// O(n log n) for n top logprobs; top_p alone uses a quickselect on mass
// rather than sorting the vocabulary.
//
// Thread-compatible: use one Sampler per thread.
class Sampler {
 public:
  // Samples the token at output position `output_position` (0 for the first
  // generated token). `logits` is left untouched. Parameters are assumed
  // valid (SamplingParamsFromProto). Deterministic: the same logits, params,
  // penalty state and position give the same token on every call, whatever
  // else the Sampler did before.
  // REQUIRES: !logits.empty().
  SampledToken Sample(absl::Span<const float> logits, const SamplingParams& params,
                      const PenaltyState& penalties, int64_t output_position);

 private:
  int32_t SampleFromWeights(const SamplingParams& params, int64_t output_position);
  void ComputeLogprobs(absl::Span<const float> logits, int32_t top_n, SampledToken& result);

  std::vector<float> scratch_;
  std::vector<float> values_;
  std::vector<int32_t> order_;
};

// One-shot convenience: a temporary Sampler.
SampledToken Sample(absl::Span<const float> logits, const SamplingParams& params,
                    const PenaltyState& penalties, int64_t output_position);

}  // namespace trident::sampling

#endif  // TRIDENT_COMMON_SAMPLING_SAMPLER_H_
