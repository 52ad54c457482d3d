#include "tools/cli/generate.h"

#include <memory>

#include "common/grpc/status.h"
#include "grpcpp/grpcpp.h"
#include "trident/v1/generation.grpc.pb.h"

namespace trident::cli {

absl::StatusOr<GenerateSummary> StreamGeneration(const GenerateOptions& options, std::FILE* out) {
  auto channel = grpc::CreateChannel(options.address, grpc::InsecureChannelCredentials());
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
  std::unique_ptr<grpc::ClientReader<trident::v1::GenerateResponse>> reader =
      stub->Generate(&context, request);
  GenerateSummary summary;
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
    }
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  return summary;
}

}  // namespace trident::cli
