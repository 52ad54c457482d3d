// A worker's session with a CPU attention service: Attention.Connect with
// the worker's data-plane endpoint, then the data-plane channel to the
// service it answered with. Shared by the decode side's offload and the
// prefill side's prompt writes.

#ifndef TRIDENT_SERVICES_WORKER_OFFLOAD_ATTENTION_SESSION_H_
#define TRIDENT_SERVICES_WORKER_OFFLOAD_ATTENTION_SESSION_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/transport/attention/remote_attention.h"
#include "common/transport/attention/ucx_attention_client.h"
#include "trident/v1/attention.grpc.pb.h"

namespace trident::worker {

struct AttentionSession {
  trident::v1::ConnectResponse response;
  std::unique_ptr<transport::attention::RemoteAttention> channel;
};

// Connect (idempotent for the same endpoint) within `timeout`, then
// UcxAttentionClient::ForService. The RPC's errors (UNAVAILABLE when the
// service cannot be reached) and ForService's.
absl::StatusOr<AttentionSession> OpenAttentionSession(
    trident::v1::Attention::Stub& stub, const trident::v1::TransportEndpoint& client_endpoint,
    transport::attention::UcxAttentionClient& client, absl::Duration timeout);

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_OFFLOAD_ATTENTION_SESSION_H_
