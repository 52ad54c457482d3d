#ifndef TRIDENT_COMMON_GRPC_ASYNC_UNARY_H_
#define TRIDENT_COMMON_GRPC_ASYNC_UNARY_H_

// One unary call through a stub's callback API, for code that must not block
// its thread on the answer (a server handler calling another service). The
// call's context, request and response live on the heap until it ends;
// `done` receives the response or the status (FromGrpcStatus), exactly once,
// on a gRPC callback thread, and must not block.
//
//   CallUnaryAsync<v1::AdmitSequenceResponse>(
//       std::move(request), timeout,
//       [stub](auto* context, auto* request, auto* response, auto on_done) {
//         stub->async()->AdmitSequence(context, request, response, std::move(on_done));
//       },
//       [](absl::StatusOr<v1::AdmitSequenceResponse> answer) { ... });

#include <functional>
#include <memory>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc/status.h"
#include "grpcpp/grpcpp.h"

namespace trident {

template <typename Response>
using UnaryDone = absl::AnyInvocable<void(absl::StatusOr<Response>) &&>;

// `start(context, request, response, on_done)` starts the call (the stub's
// async() method); `timeout` <= 0 sets no deadline.
template <typename Response, typename Request, typename Start>
void CallUnaryAsync(Request request, absl::Duration timeout, Start start,
                    UnaryDone<Response> done) {
  struct Call {
    grpc::ClientContext context;
    Request request;
    Response response;
    UnaryDone<Response> done;
  };
  auto* call = new Call;
  call->request = std::move(request);
  call->done = std::move(done);
  if (timeout > absl::ZeroDuration()) {
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  start(&call->context, &call->request, &call->response,
        std::function<void(grpc::Status)>([call](grpc::Status status) {
          // The context, request and response are freed before `done` runs,
          // so a caller woken by `done` may tear down its channel (and gRPC
          // with it) without racing this thread's cleanup of the call.
          std::unique_ptr<Call> owned(call);
          UnaryDone<Response> done = std::move(owned->done);
          absl::StatusOr<Response> answer =
              status.ok() ? absl::StatusOr<Response>(std::move(owned->response))
                          : absl::StatusOr<Response>(FromGrpcStatus(status));
          owned.reset();
          std::move(done)(std::move(answer));
        }));
}

}  // namespace trident

#endif  // TRIDENT_COMMON_GRPC_ASYNC_UNARY_H_
