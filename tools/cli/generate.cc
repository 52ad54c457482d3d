#include "tools/cli/generate.h"

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/grpc/status.h"
#include "common/grpc/tls.h"
#include "common/time/proto_time.h"
#include "grpcpp/grpcpp.h"
#include "trident/v1/generation.grpc.pb.h"

namespace trident::cli {
namespace {

std::string Milliseconds(const google::protobuf::Duration& d) {
  return absl::StrFormat("%.1f ms", absl::ToDoubleMilliseconds(DurationFromProto(d)));
}

std::string FinishReasonName(trident::v1::FinishReason reason) {
  absl::string_view name = trident::v1::FinishReason_Name(reason);
  absl::ConsumePrefix(&name, "FINISH_REASON_");
  return absl::AsciiStrToLower(name);
}

// "[label: a, b, c]\n" ("[a, b, c]\n" without a label), or "" when `parts`
// is empty.
std::string Line(absl::string_view label, const std::vector<std::string>& parts) {
  if (parts.empty()) return "";
  return absl::StrCat("[", label, label.empty() ? "" : ": ", absl::StrJoin(parts, ", "), "]\n");
}

}  // namespace

absl::StatusOr<GenerateSummary> StreamGeneration(const GenerateOptions& options, std::FILE* out) {
  auto channel = CreateClusterChannel(options.address);
  auto stub = trident::v1::Generation::NewStub(channel);
  trident::v1::GenerateRequest request;
  request.set_text(options.prompt);
  request.mutable_sampling()->set_max_tokens(options.max_tokens);
  request.mutable_sampling()->set_temperature(options.temperature);
  if (options.seed.has_value()) request.mutable_sampling()->set_seed(*options.seed);
  request.mutable_stop()->set_ignore_eos(options.ignore_eos);
  request.mutable_options()->set_text_deltas(true);

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(options.timeout));
  if (!options.api_key.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", options.api_key));
  }
  std::unique_ptr<grpc::ClientReader<trident::v1::GenerateResponse>> reader =
      stub->Generate(&context, request);
  GenerateSummary summary;
  bool completed = false;
  trident::v1::GenerateResponse response;
  while (reader->Read(&response)) {
    if (response.has_chunk()) {
      const std::string& delta = response.chunk().text_delta();
      summary.text += delta;
      summary.tokens += response.chunk().token_ids_size();
      if (out != nullptr && !delta.empty()) {
        std::fwrite(delta.data(), 1, delta.size(), out);
        std::fflush(out);
      }
    } else if (response.has_complete()) {
      summary.complete = response.complete();
      completed = true;
    }
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  if (!completed) {
    return absl::InternalError(
        absl::StrCat(options.address, " ended the stream without its GenerateComplete"));
  }
  return summary;
}

std::string FormatCompletion(const trident::v1::GenerateComplete& c) {
  const trident::v1::Timings& t = c.timings();
  std::vector<std::string> result = {absl::StrCat(c.usage().prompt_tokens(), " prompt tokens"),
                                     absl::StrCat(c.usage().completion_tokens(), " generated"),
                                     absl::StrCat("finish ", FinishReasonName(c.finish_reason()))};
  if (!c.error_message().empty()) result.push_back(absl::StrCat("error: ", c.error_message()));
  const double decode_seconds = absl::ToDoubleSeconds(DurationFromProto(t.decode()));
  if (t.has_decode() && decode_seconds > 0 && c.usage().completion_tokens() > 1) {
    result.push_back(absl::StrFormat("%.1f tokens/s decode",
                                     (c.usage().completion_tokens() - 1) / decode_seconds));
  }

  std::vector<std::string> placement;
  const trident::v1::Placement& p = c.placement();
  if (!p.prefill_worker_id().empty()) placement.push_back("prefill " + p.prefill_worker_id());
  if (!p.decode_worker_id().empty()) placement.push_back("decode " + p.decode_worker_id());
  if (!p.attention_service_id().empty()) {
    placement.push_back("attention " + p.attention_service_id());
  }

  std::vector<std::string> timings;
  const std::pair<const char*, const google::protobuf::Duration*> phases[] = {
      {"queued", t.has_queued() ? &t.queued() : nullptr},
      {"prefill", t.has_prefill() ? &t.prefill() : nullptr},
      {"kv_transfer", t.has_kv_transfer() ? &t.kv_transfer() : nullptr},
      {"time_to_first_token", t.has_time_to_first_token() ? &t.time_to_first_token() : nullptr},
      {"time_per_output_token",
       t.has_time_per_output_token() ? &t.time_per_output_token() : nullptr}};
  for (const auto& [name, duration] : phases) {
    if (duration != nullptr) timings.push_back(absl::StrCat(name, " ", Milliseconds(*duration)));
  }
  return absl::StrCat(Line(c.request_id(), result), Line("placement", placement),
                      Line("timings", timings));
}

}  // namespace trident::cli
