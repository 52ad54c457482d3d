// The public trident.v1.Generation API in front of a token source: the
// router's remote prefill -> decode path, or a worker's own engine (role
// `both`, no router in front). Tokenization, validation, sampling and stop
// conditions, streamed token chunks with incremental detokenization, the
// final GenerateComplete (usage, timings, placement), cancellation and
// Abort. It knows no model backend.

#ifndef TRIDENT_COMMON_FRONTEND_GENERATION_SERVICE_H_
#define TRIDENT_COMMON_FRONTEND_GENERATION_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/token_source.h"
#include "common/frontend/authenticator.h"
#include "common/frontend/call_gate.h"
#include "common/time/clock.h"
#include "common/tokenizer/tokenizer.h"
#include "trident/v1/generation.grpc.pb.h"

namespace trident::frontend {

// Every method takes its request raw and parses it itself
// (common/grpc/wire_check.h), so that a request that does not parse is
// INVALID_ARGUMENT naming the field at fault.
using RawGenerationService = trident::v1::Generation::WithRawCallbackMethod_Generate<
    trident::v1::Generation::WithRawCallbackMethod_Tokenize<
        trident::v1::Generation::WithRawCallbackMethod_Detokenize<
            trident::v1::Generation::WithRawCallbackMethod_Abort<
                trident::v1::Generation::WithRawCallbackMethod_ModelInfo<
                    trident::v1::Generation::Service>>>>>;

// Thread-safe.
class GenerationService final : public RawGenerationService {
 public:
  // `engine` (the worker's Engine, or the router's remote path), `tokenizer`
  // and `clock` must outlive the service. `gate` (null: every call is
  // taken) admits each Generate call and may end it early; it must outlive
  // the service.
  // `authenticator` (null: every caller is served) checks each call's
  // credentials first (UNAUTHENTICATED) and limits its QoS classes
  // (PERMISSION_DENIED); a request can be aborted by its own tenant only.
  // It must outlive the service.
  GenerationService(engine::TokenSource* engine, const tokenizer::Tokenizer* tokenizer,
                    const trident::v1::ModelInfoResponse& model_info, Clock* clock,
                    CallGate* gate = nullptr, Authenticator* authenticator = nullptr);

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ModelInfo(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;

 private:
  class Stream;

  absl::Status DoTokenize(const trident::v1::TokenizeRequest& request,
                          trident::v1::TokenizeResponse* response) const;
  absl::Status DoDetokenize(const trident::v1::DetokenizeRequest& request,
                            trident::v1::DetokenizeResponse* response) const;
  absl::Status DoAbort(const Principal& caller, const trident::v1::AbortRequest& request,
                       trident::v1::AbortResponse* response);
  // The caller; everyone (an empty principal) without an authenticator.
  absl::StatusOr<Principal> Authenticate(const grpc::CallbackServerContext& context) const;

  absl::Status CheckModel(const std::string& model) const;
  // Request ids in flight: ALREADY_EXISTS for a second one.
  absl::Status Register(const std::string& id, const std::string& tenant);
  void Unregister(const std::string& id);

  engine::TokenSource* engine_;
  const tokenizer::Tokenizer* tokenizer_;
  trident::v1::ModelInfoResponse model_info_;
  Clock* clock_;
  CallGate* const gate_;
  Authenticator* const authenticator_;
  std::atomic<uint64_t> next_id_{1};
  uint64_t id_salt_;
  absl::Mutex mu_;
  // Request ids in flight, with their tenant.
  absl::flat_hash_map<std::string, std::string> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::frontend

#endif  // TRIDENT_COMMON_FRONTEND_GENERATION_SERVICE_H_
