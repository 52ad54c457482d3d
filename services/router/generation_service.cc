#include "services/router/generation_service.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/grpc/reactors.h"

namespace trident::router {
namespace {

using ::trident::v1::GenerateResponse;

absl::Status NotServedYet(absl::string_view method, absl::string_view missing) {
  return absl::UnimplementedError(absl::StrCat(
      "trident.v1.Generation/", method, " is not served by this router build: it needs ", missing));
}

constexpr absl::string_view kNeedsEngine =
    "a model (the worker's model runtime and tokenizer) and the router's admission and "
    "prefill/decode path, which this build does not have yet";

}  // namespace

grpc::ServerWriteReactor<GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const trident::v1::GenerateRequest* request) {
  return new FinishedWriteReactor<GenerateResponse>(NotServedYet("Generate", kNeedsEngine));
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const trident::v1::TokenizeRequest* request,
                                                      trident::v1::TokenizeResponse* response) {
  return FinishUnary(context, NotServedYet("Tokenize", "a model's tokenizer (tokenizer.json)"));
}

grpc::ServerUnaryReactor* GenerationService::Detokenize(
    grpc::CallbackServerContext* context, const trident::v1::DetokenizeRequest* request,
    trident::v1::DetokenizeResponse* response) {
  return FinishUnary(context, NotServedYet("Detokenize", "a model's tokenizer (tokenizer.json)"));
}

grpc::ServerUnaryReactor* GenerationService::Abort(grpc::CallbackServerContext* context,
                                                   const trident::v1::AbortRequest* request,
                                                   trident::v1::AbortResponse* response) {
  return FinishUnary(context, NotServedYet("Abort", "requests in flight, which need Generate"));
}

grpc::ServerUnaryReactor* GenerationService::ModelInfo(grpc::CallbackServerContext* context,
                                                       const trident::v1::ModelInfoRequest* request,
                                                       trident::v1::ModelInfoResponse* response) {
  return FinishUnary(context, NotServedYet("ModelInfo", "a loaded model (--model)"));
}

}  // namespace trident::router
