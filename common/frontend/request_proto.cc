#include "common/frontend/request_proto.h"

#include "absl/strings/str_cat.h"
#include "common/sampling/sampling_params.h"
#include "common/status/error_details.h"
#include "common/status/status_macros.h"

namespace trident::frontend {

absl::Status ValidatePromptTokenIds(
    const google::protobuf::RepeatedField<int32_t>& prompt_token_ids, int32_t vocab_size) {
  for (int i = 0; i < prompt_token_ids.size(); ++i) {
    const int32_t t = prompt_token_ids.Get(i);
    if (t < 0 || t >= vocab_size) {
      return InvalidArgumentForField(
          absl::StrCat("prompt_token_ids[", i, "]"),
          absl::StrCat("token id ", t, " is outside [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<engine::EngineRequest> EngineRequestFromProto(
    const std::string& request_id, const google::protobuf::RepeatedField<int32_t>& prompt_token_ids,
    const trident::v1::SamplingParams& sampling, const trident::v1::StopConditions& stop,
    const trident::v1::OutputOptions& options, const trident::v1::ModelInfoResponse& model_info,
    int32_t resumed_outputs) {
  if (request_id.empty()) return InvalidArgumentForField("request_id", "must not be empty");
  TRIDENT_RETURN_IF_ERROR(ValidatePromptTokenIds(prompt_token_ids, model_info.vocab_size()));
  engine::EngineRequest er;
  er.id = request_id;
  er.prompt.assign(prompt_token_ids.begin(), prompt_token_ids.end());
  if (er.prompt.empty()) return InvalidArgumentForField("prompt_token_ids", "must not be empty");
  if (resumed_outputs < 0 || static_cast<size_t>(resumed_outputs) >= er.prompt.size()) {
    return InvalidArgumentForField(
        "resumed_outputs", absl::StrCat("is ", resumed_outputs, "; must be 0 to ",
                                        er.prompt.size() - 1, " (fewer than the prompt's ",
                                        er.prompt.size(), " tokens)"));
  }
  er.resumed_outputs = resumed_outputs;
  TRIDENT_ASSIGN_OR_RETURN(
      er.sampling, sampling::SamplingParamsFromProto(sampling, options, model_info.vocab_size(),
                                                     /*default_seed=*/0));
  TRIDENT_ASSIGN_OR_RETURN(sampling::StopParams s,
                           sampling::StopParamsFromProto(sampling, stop, model_info.vocab_size(),
                                                         model_info.max_context_tokens(),
                                                         static_cast<int32_t>(er.prompt.size()) -
                                                             resumed_outputs));
  if (resumed_outputs >= s.max_tokens) {
    return InvalidArgumentForField("resumed_outputs",
                                   absl::StrCat("is ", resumed_outputs,
                                                "; must be below sampling.max_tokens (",
                                                s.max_tokens, "), which counts them"));
  }
  er.max_tokens = s.max_tokens;
  er.stop_token_ids = s.stop_token_ids;
  if (!s.ignore_eos) {
    er.stop_token_ids.insert(er.stop_token_ids.end(), model_info.eos_token_ids().begin(),
                             model_info.eos_token_ids().end());
  }
  return er;
}

trident::v1::FinishReason FinishReasonToProto(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop:
      return trident::v1::FINISH_REASON_STOP;
    case engine::FinishReason::kLength:
      return trident::v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kAborted:
      return trident::v1::FINISH_REASON_ABORT;
    case engine::FinishReason::kError:
      return trident::v1::FINISH_REASON_ERROR;
    case engine::FinishReason::kPrefilled:
    case engine::FinishReason::kNone:
      break;
  }
  return trident::v1::FINISH_REASON_UNSPECIFIED;
}

engine::FinishReason FinishReasonFromProto(trident::v1::FinishReason reason) {
  switch (reason) {
    case trident::v1::FINISH_REASON_STOP:
      return engine::FinishReason::kStop;
    case trident::v1::FINISH_REASON_LENGTH:
      return engine::FinishReason::kLength;
    case trident::v1::FINISH_REASON_ABORT:
      return engine::FinishReason::kAborted;
    default:
      return engine::FinishReason::kError;
  }
}

void AppendLogprobs(const engine::TokenEvent& event, trident::v1::TokenChunk* chunk) {
  trident::v1::TokenLogprobs* lp = chunk->add_logprobs();
  lp->set_token_id(event.token);
  lp->set_logprob(event.logprob);
  for (const auto& [id, logprob] : event.top_logprobs) {
    trident::v1::TopLogprob* top = lp->add_top_logprobs();
    top->set_token_id(id);
    top->set_logprob(logprob);
  }
}

}  // namespace trident::frontend
