#ifndef TRIDENT_COMMON_GRPC_STATUS_H_
#define TRIDENT_COMMON_GRPC_STATUS_H_

// The one place where absl::Status and grpc::Status convert into each other.
// Both enumerate google.rpc.Code, so codes carry over unchanged. Payloads of
// the absl::Status (see common/status/error_details.h) travel as the details
// of a google.rpc.Status in the `grpc-status-details-bin` trailer.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace trident {

// Converts a handler's result for the wire. Messages and payloads are kept.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Converts an RPC's result on the client side. Details that arrived as a
// google.rpc.Status become payloads again, so GetRetryDelay() works on them.
absl::Status FromGrpcStatus(const grpc::Status& status);

// FromGrpcStatus with `context` before the message ("<context>: <message>"),
// e.g. "CommitKv to 10.0.0.7:50052": code and details kept.
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context);

}  // namespace trident

#endif  // TRIDENT_COMMON_GRPC_STATUS_H_
