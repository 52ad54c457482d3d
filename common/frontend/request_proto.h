// Conversions between the engine's types and the RPC messages: the engine
// request a worker's Prefill or Decode call describes: prompt ids
// checked against the vocabulary, sampling and stop conditions converted as
// the public API defines them, and the model's EOS ids added as stop tokens
// unless ignore_eos.

#ifndef TRIDENT_COMMON_FRONTEND_REQUEST_PROTO_H_
#define TRIDENT_COMMON_FRONTEND_REQUEST_PROTO_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/engine/request.h"
#include "google/protobuf/repeated_field.h"
#include "trident/v1/generation.pb.h"

namespace trident::frontend {

// OK when every id of `prompt_token_ids` is in [0, vocab_size); else
// INVALID_ARGUMENT naming the first outside it (prompt_token_ids[i]).
absl::Status ValidatePromptTokenIds(
    const google::protobuf::RepeatedField<int32_t>& prompt_token_ids, int32_t vocab_size);

// INVALID_ARGUMENT naming the field (prompt_token_ids[i], sampling.*,
// stop.*, resumed_outputs) for bad input. `resumed_outputs`: the last that
// many prompt ids are outputs of a migrated request
// (EngineRequest::resumed_outputs); sampling.max_tokens counts them.
absl::StatusOr<engine::EngineRequest> EngineRequestFromProto(
    const std::string& request_id, const google::protobuf::RepeatedField<int32_t>& prompt_token_ids,
    const trident::v1::SamplingParams& sampling, const trident::v1::StopConditions& stop,
    const trident::v1::OutputOptions& options, const trident::v1::ModelInfoResponse& model_info,
    int32_t resumed_outputs = 0);

// The public finish reason of an engine's; kNone and kPrefilled (internal)
// map to FINISH_REASON_UNSPECIFIED.
trident::v1::FinishReason FinishReasonToProto(engine::FinishReason reason);
// The engine's reading of a worker's finish reason; unknown ones are kError.
engine::FinishReason FinishReasonFromProto(trident::v1::FinishReason reason);

// Appends the token's logprob and top alternatives to `chunk`.
void AppendLogprobs(const engine::TokenEvent& event, trident::v1::TokenChunk* chunk);

}  // namespace trident::frontend

#endif  // TRIDENT_COMMON_FRONTEND_REQUEST_PROTO_H_
