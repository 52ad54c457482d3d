// Feeds arbitrary bytes to the public API's request parsing and validation:
// the first byte picks the resumed-output count and the default seed, the
// rest is a serialized trident.v1.GenerateRequest.
//
// ParseRequest (common/grpc/wire_check.h) must agree with protobuf: a
// request it accepts protobuf parses too, and a rejection is
// INVALID_ARGUMENT naming a field in a BadRequest detail. The string and
// ByteBuffer overloads must agree. Parsed requests then go through
// SamplingParamsFromProto, StopParamsFromProto and EngineRequestFromProto
// (the worker-side path) against a fixed model; every rejection must be
// INVALID_ARGUMENT naming a field the functions document, and every
// acceptance must respect the documented bounds.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "common/engine/request.h"
#include "common/frontend/request_proto.h"
#include "common/grpc/wire_check.h"
#include "common/sampling/sampling_params.h"
#include "common/status/error_details.h"
#include "common/tokenizer/unicode.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "trident/v1/generation.pb.h"

namespace {

using trident::v1::GenerateRequest;

// protobuf logs every string field of invalid UTF-8 it refuses, which the
// fuzzer makes many of.
[[maybe_unused]] const bool kProtobufQuiet = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

constexpr int32_t kVocabSize = 512;
constexpr int32_t kMaxContext = 2048;
constexpr int32_t kEosId = 2;

const trident::v1::ModelInfoResponse& ModelInfo() {
  static const trident::v1::ModelInfoResponse* info = [] {
    auto* m = new trident::v1::ModelInfoResponse;
    m->set_model("fuzz");
    m->set_vocab_size(kVocabSize);
    m->set_max_context_tokens(kMaxContext);
    m->add_eos_token_ids(kEosId);
    m->set_max_logprobs_top_n(trident::sampling::kMaxTopLogprobs);
    return m;
  }();
  return *info;
}

// The BadRequest field of an error, which must be INVALID_ARGUMENT and whose
// message must start with that field.
std::string FieldOf(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kInvalidArgument) abort();
  std::optional<std::string> field = trident::GetBadRequestField(status);
  if (!field.has_value() || field->empty()) abort();
  if (!absl::StartsWith(status.message(), *field)) abort();
  return *field;
}

bool FieldIn(const std::string& field, std::initializer_list<absl::string_view> prefixes) {
  for (absl::string_view p : prefixes) {
    if (absl::StartsWith(field, p)) return true;
  }
  return false;
}

// ParseRequest's verdict on `bytes`, cross-checked with protobuf and with the
// ByteBuffer overload over the same bytes cut into three slices.
absl::Status ParseChecked(absl::string_view bytes, GenerateRequest* request) {
  const absl::Status status = trident::ParseRequest(bytes, request);
  GenerateRequest by_protobuf;
  const bool protobuf_ok = by_protobuf.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  if (status.ok() && !protobuf_ok) abort();
  if (!status.ok()) FieldOf(status);
  if (status.ok() && request->SerializeAsString() != by_protobuf.SerializeAsString()) abort();

  const size_t cut1 = bytes.size() / 3;
  const size_t cut2 = 2 * bytes.size() / 3;
  std::vector<grpc::Slice> slices;
  for (const auto& [begin, end] :
       {std::pair<size_t, size_t>{0, cut1}, {cut1, cut2}, {cut2, bytes.size()}}) {
    slices.emplace_back(bytes.data() + begin, end - begin);
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  GenerateRequest from_buffer;
  const absl::Status buffer_status = trident::ParseRequest(buffer, &from_buffer);
  if (buffer_status.ok() != status.ok()) abort();
  if (!status.ok() &&
      trident::GetBadRequestField(buffer_status) != trident::GetBadRequestField(status)) {
    abort();
  }
  if (status.ok() && from_buffer.SerializeAsString() != request->SerializeAsString()) abort();
  return status;
}

void CheckSampling(const GenerateRequest& request, uint64_t default_seed) {
  absl::StatusOr<trident::sampling::SamplingParams> p = trident::sampling::SamplingParamsFromProto(
      request.sampling(), request.options(), kVocabSize, default_seed);
  if (!p.ok()) {
    if (!FieldIn(FieldOf(p.status()), {"sampling.", "options."})) abort();
    return;
  }
  using trident::sampling::kMaxAbsAdditivePenalty;
  if (!std::isfinite(p->temperature) || p->temperature < 0 ||
      p->temperature > trident::sampling::kMaxTemperature) {
    abort();
  }
  if (!(p->top_p > 0 && p->top_p <= 1)) abort();
  if (p->top_k < 0 || p->top_k > kVocabSize) abort();
  if (!(p->min_p >= 0 && p->min_p <= 1)) abort();
  if (!(p->repetition_penalty > 0 &&
        p->repetition_penalty <= trident::sampling::kMaxRepetitionPenalty)) {
    abort();
  }
  for (float penalty : {p->presence_penalty, p->frequency_penalty}) {
    if (!(penalty >= -kMaxAbsAdditivePenalty && penalty <= kMaxAbsAdditivePenalty)) abort();
  }
  if (p->top_logprobs < 0 || p->top_logprobs > trident::sampling::kMaxTopLogprobs) abort();
  if (p->top_logprobs > 0 && !p->logprobs) abort();
  if (p->seed != (request.sampling().has_seed() ? request.sampling().seed() : default_seed)) {
    abort();
  }
}

void CheckStop(const GenerateRequest& request, int32_t prompt_tokens) {
  absl::StatusOr<trident::sampling::StopParams> s = trident::sampling::StopParamsFromProto(
      request.sampling(), request.stop(), kVocabSize, kMaxContext, prompt_tokens);
  if (!s.ok()) {
    const std::string field = FieldOf(s.status());
    if (field != "prompt" && field != "sampling.max_tokens" && !FieldIn(field, {"stop."})) abort();
    if (field == "prompt" && prompt_tokens >= 1 && prompt_tokens < kMaxContext) abort();
    return;
  }
  if (prompt_tokens < 1 || prompt_tokens >= kMaxContext) abort();
  if (s->max_tokens < 1 || s->max_tokens > kMaxContext - prompt_tokens) abort();
  if (s->stop_strings.size() > static_cast<size_t>(trident::sampling::kMaxStopStrings)) abort();
  for (const std::string& str : s->stop_strings) {
    if (str.empty() || str.size() > static_cast<size_t>(trident::sampling::kMaxStopStringBytes) ||
        !trident::tokenizer::IsValidUtf8(str)) {
      abort();
    }
  }
  if (s->stop_token_ids.size() > static_cast<size_t>(trident::sampling::kMaxStopTokenIds)) abort();
  for (int32_t id : s->stop_token_ids) {
    if (id < 0 || id >= kVocabSize) abort();
  }
  if (s->ignore_eos != request.stop().ignore_eos()) abort();
}

void CheckEngineRequest(const GenerateRequest& request, int32_t resumed_outputs) {
  const auto& ids = request.token_ids().ids();
  absl::StatusOr<trident::engine::EngineRequest> er = trident::frontend::EngineRequestFromProto(
      request.request_id(), ids, request.sampling(), request.stop(), request.options(), ModelInfo(),
      resumed_outputs);
  if (!er.ok()) {
    // "prompt" comes from StopParamsFromProto: the prompt proper (less the
    // resumed outputs) does not fit the context.
    if (!FieldIn(FieldOf(er.status()), {"request_id", "prompt_token_ids", "resumed_outputs",
                                        "sampling.", "stop.", "options.", "prompt"})) {
      abort();
    }
    return;
  }
  if (er->id.empty() || er->id != request.request_id()) abort();
  if (!absl::c_equal(er->prompt, ids)) abort();
  const int64_t prompt = static_cast<int64_t>(er->prompt.size());
  if (prompt < 1) abort();
  for (int32_t id : er->prompt) {
    if (id < 0 || id >= kVocabSize) abort();
  }
  if (er->resumed_outputs != resumed_outputs || resumed_outputs < 0 || resumed_outputs >= prompt) {
    abort();
  }
  // max_tokens counts the resumed outputs, and the whole sequence fits.
  if (er->max_tokens <= resumed_outputs) abort();
  if (prompt - resumed_outputs + er->max_tokens > kMaxContext) abort();
  for (int32_t id : request.stop().stop_token_ids()) {
    if (!absl::c_linear_search(er->stop_token_ids, id)) abort();
  }
  if (!request.stop().ignore_eos() && !absl::c_linear_search(er->stop_token_ids, kEosId)) {
    abort();
  }
  for (int32_t id : er->stop_token_ids) {
    if (id < 0 || id >= kVocabSize) abort();
  }
  absl::StatusOr<trident::sampling::SamplingParams> sampling =
      trident::sampling::SamplingParamsFromProto(request.sampling(), request.options(), kVocabSize,
                                                 /*default_seed=*/0);
  if (!sampling.ok() || !(*sampling == er->sampling)) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t control = data[0];
  const absl::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  GenerateRequest request;
  if (!ParseChecked(bytes, &request).ok()) return 0;

  // What a parsed request serializes to is a well-formed request again.
  GenerateRequest again;
  if (!trident::ParseRequest(request.SerializeAsString(), &again).ok()) abort();

  CheckSampling(request, /*default_seed=*/control * 0x9e3779b97f4a7c15ULL);
  const int64_t prompt_tokens = request.has_token_ids()
                                    ? request.token_ids().ids_size()
                                    : static_cast<int64_t>(request.text().size());
  CheckStop(request, static_cast<int32_t>(std::min<int64_t>(prompt_tokens, INT32_MAX)));
  // -1 to 14 resumed outputs.
  CheckEngineRequest(request, static_cast<int32_t>(control & 0x0f) - 1);
  return 0;
}
