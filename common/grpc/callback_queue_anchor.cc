#include "common/grpc/callback_queue_anchor.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <chrono>
#include <memory>

#include "absl/synchronization/notification.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace trident {
namespace {

void Anchor() {
  // Never destroyed: it holds the shared callback queue from its first
  // callback call on.
  auto* channel = new std::shared_ptr<grpc::Channel>(
      grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()));
#if defined(__SANITIZE_ADDRESS__)
  // Kept on purpose: not a leak for LeakSanitizer.
  __lsan_ignore_object(channel);
#endif
  auto stub = grpc::health::v1::Health::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  absl::Notification done;
  stub->async()->Check(&context, &request, &response, [&done](grpc::Status) { done.Notify(); });
  done.WaitForNotification();
}

}  // namespace

void AnchorCallbackCompletionQueue() {
  static const bool anchored = [] {
    Anchor();
    return true;
  }();
  (void)anchored;
}

}  // namespace trident
