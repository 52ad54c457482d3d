#ifndef TRIDENT_SERVICES_ATTENTION_ATTENTION_SERVICE_H_
#define TRIDENT_SERVICES_ATTENTION_ATTENTION_SERVICE_H_

// The CPU attention service's control RPCs (trident.v1.Attention): UCX
// connection set-up, admission and release of offloaded sequences, stats.
// Per-layer q/k/v and outputs travel over UCX, not gRPC.
//
// This build holds no KV yet: every RPC answers UNIMPLEMENTED and names what
// it needs.

#include "trident/v1/attention.grpc.pb.h"

namespace trident::attention {

// Thread-safe.
class AttentionService final : public trident::v1::Attention::CallbackService {
 public:
  grpc::ServerUnaryReactor* Connect(grpc::CallbackServerContext* context,
                                    const trident::v1::ConnectRequest* request,
                                    trident::v1::ConnectResponse* response) override;
  grpc::ServerUnaryReactor* AdmitSequence(grpc::CallbackServerContext* context,
                                          const trident::v1::AdmitSequenceRequest* request,
                                          trident::v1::AdmitSequenceResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseSequence(
      grpc::CallbackServerContext* context, const trident::v1::ReleaseSequenceRequest* request,
      trident::v1::ReleaseSequenceResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const trident::v1::GetAttentionStatsRequest* request,
                                     trident::v1::AttentionStats* response) override;
};

}  // namespace trident::attention

#endif  // TRIDENT_SERVICES_ATTENTION_ATTENTION_SERVICE_H_
