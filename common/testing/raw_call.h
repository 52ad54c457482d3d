#ifndef TRIDENT_COMMON_TESTING_RAW_CALL_H_
#define TRIDENT_COMMON_TESTING_RAW_CALL_H_

// Sends arbitrary bytes as a request, for tests of how servers answer
// malformed ones. A server-streaming method is called the same way (one
// request, then half-close); the call's status is what comes back.

#include <chrono>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace trident::testing {

// Calls `method` ("/package.Service/Method") with `bytes` as the request
// and `metadata` as headers; returns the call's status (10 s deadline).
inline grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& method, const std::string& bytes,
                                 const std::multimap<std::string, std::string>& metadata = {}) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  for (const auto& [key, value] : metadata) context.AddMetadata(key, value);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

}  // namespace trident::testing

#endif  // TRIDENT_COMMON_TESTING_RAW_CALL_H_
