#ifndef TRIDENT_SERVICES_ROUTER_GENERATION_SERVICE_H_
#define TRIDENT_SERVICES_ROUTER_GENERATION_SERVICE_H_

// The router's implementation of the public `trident.v1.Generation` API.
// This build serves the API surface only: every RPC answers UNIMPLEMENTED
// and says what it is waiting for (the model runtime serves Generate and
// Tokenize; admission and the prefill → decode path serve the router's
// side).

#include "trident/v1/generation.grpc.pb.h"

namespace trident::router {

// Thread-safe.
class GenerationService final : public trident::v1::Generation::CallbackService {
 public:
  grpc::ServerWriteReactor<trident::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const trident::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const trident::v1::TokenizeRequest* request,
                                     trident::v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const trident::v1::DetokenizeRequest* request,
                                       trident::v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const trident::v1::AbortRequest* request,
                                  trident::v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* ModelInfo(grpc::CallbackServerContext* context,
                                      const trident::v1::ModelInfoRequest* request,
                                      trident::v1::ModelInfoResponse* response) override;
};

}  // namespace trident::router

#endif  // TRIDENT_SERVICES_ROUTER_GENERATION_SERVICE_H_
