#ifndef TRIDENT_COMMON_GRPC_REACTORS_H_
#define TRIDENT_COMMON_GRPC_REACTORS_H_

// Reactors for callback-API handlers that answer with a status and nothing
// else (validation failures, methods a build does not serve). Each converts
// the absl::Status exactly once, through ToGrpcStatus.

#include "absl/status/status.h"
#include "common/grpc/status.h"
#include "grpcpp/grpcpp.h"

namespace trident {

// Finishes a unary call with `status`.
inline grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                             const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// A server-streaming reactor that sends nothing and finishes with a status.
template <typename Response>
class FinishedWriteReactor final : public grpc::ServerWriteReactor<Response> {
 public:
  explicit FinishedWriteReactor(const absl::Status& status) {
    this->Finish(ToGrpcStatus(status));
  }
  void OnDone() override { delete this; }
};

// A client-streaming reactor that reads nothing and finishes with a status.
template <typename Request>
class FinishedReadReactor final : public grpc::ServerReadReactor<Request> {
 public:
  explicit FinishedReadReactor(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

// A bidirectional reactor that finishes at once with a status.
template <typename Request, typename Response>
class FinishedBidiReactor final : public grpc::ServerBidiReactor<Request, Response> {
 public:
  explicit FinishedBidiReactor(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace trident

#endif  // TRIDENT_COMMON_GRPC_REACTORS_H_
