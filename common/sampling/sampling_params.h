#ifndef TRIDENT_COMMON_SAMPLING_SAMPLING_PARAMS_H_
#define TRIDENT_COMMON_SAMPLING_SAMPLING_PARAMS_H_

// Native, validated forms of a request's trident.v1.SamplingParams,
// StopConditions and OutputOptions (proto/trident/v1/generation.proto). The
// service layer converts the protos once, on arrival; the engine, the
// sampler and the stop checker only ever see these structs.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trident/v1/generation.pb.h"

namespace trident::sampling {

// Validation limits, as generation.proto documents them.
inline constexpr float kMaxTemperature = 2.0f;
inline constexpr float kMaxRepetitionPenalty = 2.0f;
inline constexpr float kMaxAbsAdditivePenalty = 2.0f;
inline constexpr int32_t kMaxTopLogprobs = 20;
inline constexpr int kMaxStopStrings = 16;
inline constexpr int kMaxStopStringBytes = 256;
inline constexpr int kMaxStopTokenIds = 64;

// How to pick each next token. Defaults mean plain sampling from the model's
// distribution (temperature 1, no truncation, no penalties).
struct SamplingParams {
  // 0 means greedy: top_k, top_p, min_p and seed are then ignored.
  float temperature = 1.0f;
  // Nucleus mass in (0, 1]; 1 keeps every token.
  float top_p = 1.0f;
  // Keep the top_k most likely tokens; 0 = off.
  int32_t top_k = 0;
  // Keep tokens with probability >= min_p * max probability; 0 = off.
  float min_p = 0.0f;
  // Over prompt and output tokens: positive logits divided, negative
  // multiplied; 1 = off.
  float repetition_penalty = 1.0f;
  // Subtracted once from every token present in the output; 0 = off.
  float presence_penalty = 0.0f;
  // Subtracted per occurrence in the output; 0 = off.
  float frequency_penalty = 0.0f;
  // Key of the random draws (see philox.h).
  uint64_t seed = 0;
  // Whether to compute the sampled token's logprob.
  bool logprobs = false;
  // How many most likely alternatives to return with logprobs; 0 = none.
  // Values above 0 imply `logprobs`.
  int32_t top_logprobs = 0;

  friend bool operator==(const SamplingParams&, const SamplingParams&) = default;
};

// When to stop generating.
struct StopParams {
  // Most tokens to generate, counting a final stop/EOS token. Resolved by
  // FromProto (never 0 there); StopChecker treats <= 0 as "no limit".
  int32_t max_tokens = 0;
  // Tokens that end generation besides the model's EOS tokens.
  std::vector<int32_t> stop_token_ids;
  // Strings that end generation when they appear in the output text.
  std::vector<std::string> stop_strings;
  // Keep generating after EOS tokens (stop_token_ids still stop).
  bool ignore_eos = false;
  // Emit a matched stop string as part of the output text.
  bool include_stop_string_in_output = false;

  friend bool operator==(const StopParams&, const StopParams&) = default;
};

// Validates `sampling` and `options` as generation.proto documents them and
// converts them. Unset optional fields take their documented defaults; an
// unset seed takes `default_seed`, which the caller draws at random per
// request. `vocab_size` bounds top_k. INVALID_ARGUMENT, with a BadRequest
// detail naming the field ("sampling.temperature", "options.logprobs_top_n",
// ...), for a value out of range or NaN.
absl::StatusOr<SamplingParams> SamplingParamsFromProto(const trident::v1::SamplingParams& sampling,
                                                       const trident::v1::OutputOptions& options,
                                                       int32_t vocab_size, uint64_t default_seed);

// Validates and converts the stop conditions together with
// `sampling.max_tokens`, which 0 resolves to max_context_tokens -
// prompt_tokens. INVALID_ARGUMENT with a BadRequest field: "prompt" when
// prompt_tokens is not in [1, max_context_tokens), "sampling.max_tokens"
// when negative or beyond the context window, "stop.stop_strings" for more
// than kMaxStopStrings strings and "stop.stop_strings[i]" for one that is
// empty, longer than kMaxStopStringBytes or not valid UTF-8,
// "stop.stop_token_ids" for more than kMaxStopTokenIds ids and
// "stop.stop_token_ids[i]" for one outside [0, vocab_size).
absl::StatusOr<StopParams> StopParamsFromProto(const trident::v1::SamplingParams& sampling,
                                               const trident::v1::StopConditions& stop,
                                               int32_t vocab_size, int32_t max_context_tokens,
                                               int32_t prompt_tokens);

}  // namespace trident::sampling

#endif  // TRIDENT_COMMON_SAMPLING_SAMPLING_PARAMS_H_
