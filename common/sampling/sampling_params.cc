#include "common/sampling/sampling_params.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status/error_details.h"
#include "common/tokenizer/unicode.h"

namespace trident::sampling {
namespace {

// Whether `value` lies in [lo, hi]; false for NaN.
bool InClosedRange(float value, float lo, float hi) { return value >= lo && value <= hi; }

}  // namespace

absl::StatusOr<SamplingParams> SamplingParamsFromProto(const trident::v1::SamplingParams& sampling,
                                                       const trident::v1::OutputOptions& options,
                                                       int32_t vocab_size, uint64_t default_seed) {
  SamplingParams params;
  if (sampling.has_temperature()) {
    params.temperature = sampling.temperature();
    if (!InClosedRange(params.temperature, 0.0f, kMaxTemperature)) {
      return InvalidArgumentForField(
          "sampling.temperature",
          absl::StrCat("is ", params.temperature, "; must be in [0, ", kMaxTemperature, "]"));
    }
  }
  if (sampling.has_top_p()) {
    params.top_p = sampling.top_p();
    if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
      return InvalidArgumentForField("sampling.top_p",
                                     absl::StrCat("is ", params.top_p, "; must be in (0, 1]"));
    }
  }
  params.top_k = sampling.top_k();
  if (params.top_k < 0 || params.top_k > vocab_size) {
    return InvalidArgumentForField(
        "sampling.top_k",
        absl::StrCat("is ", params.top_k, "; must be in [0, ", vocab_size, "] (0 = off)"));
  }
  params.min_p = sampling.min_p();
  if (!InClosedRange(params.min_p, 0.0f, 1.0f)) {
    return InvalidArgumentForField("sampling.min_p",
                                   absl::StrCat("is ", params.min_p, "; must be in [0, 1]"));
  }
  params.seed = sampling.has_seed() ? sampling.seed() : default_seed;
  if (sampling.has_repetition_penalty()) {
    params.repetition_penalty = sampling.repetition_penalty();
    if (!(params.repetition_penalty > 0.0f && params.repetition_penalty <= kMaxRepetitionPenalty)) {
      return InvalidArgumentForField("sampling.repetition_penalty",
                                     absl::StrCat("is ", params.repetition_penalty,
                                                  "; must be in (0, ", kMaxRepetitionPenalty, "]"));
    }
  }
  params.presence_penalty = sampling.presence_penalty();
  if (!InClosedRange(params.presence_penalty, -kMaxAbsAdditivePenalty, kMaxAbsAdditivePenalty)) {
    return InvalidArgumentForField(
        "sampling.presence_penalty",
        absl::StrCat("is ", params.presence_penalty, "; must be in [-2, 2]"));
  }
  params.frequency_penalty = sampling.frequency_penalty();
  if (!InClosedRange(params.frequency_penalty, -kMaxAbsAdditivePenalty, kMaxAbsAdditivePenalty)) {
    return InvalidArgumentForField(
        "sampling.frequency_penalty",
        absl::StrCat("is ", params.frequency_penalty, "; must be in [-2, 2]"));
  }
  params.top_logprobs = options.logprobs_top_n();
  if (params.top_logprobs < 0 || params.top_logprobs > kMaxTopLogprobs) {
    return InvalidArgumentForField(
        "options.logprobs_top_n",
        absl::StrCat("is ", params.top_logprobs, "; must be in [0, ", kMaxTopLogprobs, "]"));
  }
  params.logprobs = options.logprobs() || params.top_logprobs > 0;
  return params;
}

absl::StatusOr<StopParams> StopParamsFromProto(const trident::v1::SamplingParams& sampling,
                                               const trident::v1::StopConditions& stop,
                                               int32_t vocab_size, int32_t max_context_tokens,
                                               int32_t prompt_tokens) {
  if (prompt_tokens < 1 || prompt_tokens >= max_context_tokens) {
    return InvalidArgumentForField(
        "prompt",
        absl::StrCat("has ", prompt_tokens, " tokens; must be 1 to ", max_context_tokens - 1,
                     " (the context window is ", max_context_tokens, " tokens)"));
  }
  StopParams params;
  const int32_t room = max_context_tokens - prompt_tokens;
  params.max_tokens = sampling.max_tokens() == 0 ? room : sampling.max_tokens();
  if (params.max_tokens < 1 || params.max_tokens > room) {
    return InvalidArgumentForField(
        "sampling.max_tokens",
        absl::StrCat("is ", sampling.max_tokens(), "; must be 0 (fill the context) or 1 to ", room,
                     " (context window ", max_context_tokens, " minus ", prompt_tokens,
                     " prompt tokens)"));
  }
  if (stop.stop_strings_size() > kMaxStopStrings) {
    return InvalidArgumentForField(
        "stop.stop_strings",
        absl::StrCat("has ", stop.stop_strings_size(), " strings; at most ", kMaxStopStrings));
  }
  for (int i = 0; i < stop.stop_strings_size(); ++i) {
    const std::string& s = stop.stop_strings(i);
    if (s.empty() || s.size() > static_cast<size_t>(kMaxStopStringBytes) ||
        !tokenizer::IsValidUtf8(s)) {
      return InvalidArgumentForField(
          absl::StrCat("stop.stop_strings[", i, "]"),
          absl::StrCat("must be 1 to ", kMaxStopStringBytes, " bytes of valid UTF-8; is ", s.size(),
                       " bytes", tokenizer::IsValidUtf8(s) ? "" : " of invalid UTF-8"));
    }
    params.stop_strings.push_back(s);
  }
  if (stop.stop_token_ids_size() > kMaxStopTokenIds) {
    return InvalidArgumentForField(
        "stop.stop_token_ids",
        absl::StrCat("has ", stop.stop_token_ids_size(), " ids; at most ", kMaxStopTokenIds));
  }
  for (int i = 0; i < stop.stop_token_ids_size(); ++i) {
    const int32_t id = stop.stop_token_ids(i);
    if (id < 0 || id >= vocab_size) {
      return InvalidArgumentForField(absl::StrCat("stop.stop_token_ids[", i, "]"),
                                     absl::StrCat("is ", id, "; must be in [0, ", vocab_size, ")"));
    }
    params.stop_token_ids.push_back(id);
  }
  params.ignore_eos = stop.ignore_eos();
  params.include_stop_string_in_output = stop.include_stop_str_in_output();
  return params;
}

}  // namespace trident::sampling
