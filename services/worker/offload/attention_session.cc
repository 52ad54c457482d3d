#include "services/worker/offload/attention_session.h"

#include <utility>

#include "common/grpc/status.h"
#include "common/status/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace trident::worker {

absl::StatusOr<AttentionSession> OpenAttentionSession(
    trident::v1::Attention::Stub& stub, const trident::v1::TransportEndpoint& client_endpoint,
    transport::attention::UcxAttentionClient& client, absl::Duration timeout) {
  trident::v1::ConnectRequest request;
  *request.mutable_client() = client_endpoint;
  AttentionSession session;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  TRIDENT_RETURN_IF_ERROR(FromGrpcStatus(stub.Connect(&context, request, &session.response)));
  TRIDENT_ASSIGN_OR_RETURN(session.channel, client.ForService(session.response.server()));
  return session;
}

}  // namespace trident::worker
