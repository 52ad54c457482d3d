#include "common/grpc/callback_queue_anchor.h"

#include <chrono>
#include <memory>

#include "absl/synchronization/notification.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace trident {
namespace {

// Never destroyed: it holds the shared callback queue from its first
// callback call on. Kept in a global so that LeakSanitizer sees it held.
std::shared_ptr<grpc::Channel>* anchor_channel = nullptr;

void Anchor() {
  auto* channel = new std::shared_ptr<grpc::Channel>(
      grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials()));
  anchor_channel = channel;
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
