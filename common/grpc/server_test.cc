#include "common/grpc/server.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc/test_service.grpc.pb.h"
#include "common/testing/raw_call.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"

namespace trident {
namespace {

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

// Parks each call until Release() or until the call is cancelled (which a
// drain past its deadline does), so tests can drain with a call in flight.
class ParkingService final : public trident::testing::Parking::CallbackService {
 public:
  grpc::ServerUnaryReactor* Park(grpc::CallbackServerContext* context,
                                 const trident::testing::ParkRequest* request,
                                 trident::testing::ParkResponse* response) override {
    auto* reactor = new Reactor();
    {
      absl::MutexLock lock(&mu_);
      reactor_ = reactor;
    }
    arrived_.Notify();
    return reactor;
  }

  void WaitForCall() { arrived_.WaitForNotification(); }

  void Release() {
    absl::MutexLock lock(&mu_);
    reactor_->FinishOnce(grpc::Status::OK);
  }

 private:
  class Reactor final : public grpc::ServerUnaryReactor {
   public:
    void FinishOnce(grpc::Status status) {
      if (!finished_.exchange(true)) Finish(std::move(status));
    }
    void OnCancel() override { FinishOnce(grpc::Status::CANCELLED); }
    void OnDone() override {}  // Owned by the service, which outlives the server.

   private:
    std::atomic<bool> finished_{false};
  };

  absl::Mutex mu_;
  Reactor* reactor_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Notification arrived_;

 public:
  ~ParkingService() { delete reactor_; }
};

std::shared_ptr<grpc::Channel> Channel(int port) {
  return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
}

HealthCheckResponse::ServingStatus CheckHealth(int port, const std::string& service,
                                               grpc::Status* status) {
  std::unique_ptr<Health::Stub> stub = Health::NewStub(Channel(port));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  HealthCheckRequest request;
  request.set_service(service);
  HealthCheckResponse response;
  *status = stub->Check(&context, request, &response);
  return response.status();
}

// Starts a Park call on its own thread; the result lands in `status`.
std::thread ParkInBackground(int port, grpc::Status* status) {
  return std::thread([port, status] {
    auto stub = trident::testing::Parking::NewStub(Channel(port));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    trident::testing::ParkRequest request;
    trident::testing::ParkResponse response;
    *status = stub->Park(&context, request, &response);
  });
}

TEST(GrpcServerTest, PicksAFreePortAndReportsEveryServiceServing) {
  ParkingService service;
  auto server = GrpcServer::Start({.host = "127.0.0.1", .port = 0},
                                  {{&service, "trident.testing.Parking"}});
  ASSERT_THAT(server, IsOk());
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  grpc::Status status;
  EXPECT_EQ(CheckHealth(port, "", &status), HealthCheckResponse::SERVING);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(CheckHealth(port, "trident.testing.Parking", &status), HealthCheckResponse::SERVING);
  EXPECT_TRUE(status.ok()) << status.error_message();
  CheckHealth(port, "trident.testing.Unknown", &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);

  (*server)->SetServing(false);
  EXPECT_EQ(CheckHealth(port, "trident.testing.Parking", &status),
            HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(CheckHealth(port, "", &status), HealthCheckResponse::NOT_SERVING);
}

TEST(GrpcServerTest, ARequestThatDoesNotParseIsInvalidArgumentNamingTheMethod) {
  ParkingService service;
  auto server =
      GrpcServer::Start({.host = "127.0.0.1", .port = 0}, {{&service, "trident.testing.Parking"}});
  ASSERT_THAT(server, IsOk());
  // A length-delimited field whose length runs past the end.
  grpc::Status status =
      testing::RawUnaryCall(Channel((*server)->port()), "/trident.testing.Parking/Park",
                            "\x0a\x05"
                            "ab");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("/trident.testing.Parking/Park"));
  // An unknown method is still UNIMPLEMENTED.
  status = testing::RawUnaryCall(Channel((*server)->port()), "/trident.testing.Parking/Nope", "");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

TEST(GrpcServerTest, RefusesAPortThatIsTaken) {
  ParkingService service;
  auto first = GrpcServer::Start({.host = "127.0.0.1", .port = 0}, {{&service, "a"}});
  ASSERT_THAT(first, IsOk());
  ParkingService other;
  EXPECT_THAT(GrpcServer::Start({.host = "127.0.0.1", .port = (*first)->port()}, {{&other, "b"}}),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST(GrpcServerTest, RejectsAnOutOfRangePort) {
  ParkingService service;
  EXPECT_THAT(GrpcServer::Start({.host = "127.0.0.1", .port = 70000}, {{&service, "a"}}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(GrpcServerTest, DrainLetsTheCallInFlightFinish) {
  ParkingService service;
  auto server = GrpcServer::Start({.host = "127.0.0.1", .port = 0}, {{&service, "p"}});
  ASSERT_THAT(server, IsOk());
  grpc::Status call_status = grpc::Status(grpc::StatusCode::UNKNOWN, "not finished");
  std::thread client = ParkInBackground((*server)->port(), &call_status);
  service.WaitForCall();

  absl::Notification drained;
  std::thread drainer([&] {
    (*server)->Drain(absl::Now() + absl::Seconds(60));
    drained.Notify();
  });
  // The drain waits for the parked call: it cannot have finished yet.
  EXPECT_FALSE(drained.HasBeenNotified());
  service.Release();
  drainer.join();
  client.join();
  EXPECT_TRUE(call_status.ok()) << call_status.error_message();
}

TEST(GrpcServerTest, DrainCancelsCallsStillRunningAtTheDeadline) {
  ParkingService service;
  auto server = GrpcServer::Start({.host = "127.0.0.1", .port = 0}, {{&service, "p"}});
  ASSERT_THAT(server, IsOk());
  grpc::Status call_status;
  std::thread client = ParkInBackground((*server)->port(), &call_status);
  service.WaitForCall();

  (*server)->Drain(absl::Now());  // Deadline already passed: cancel at once.
  client.join();
  EXPECT_FALSE(call_status.ok());
}

// An open grpc.health.v1 Watch stream of `service` on `port`.
struct HealthWatch {
  HealthWatch(int port, const std::string& service) : stub(Health::NewStub(Channel(port))) {
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    HealthCheckRequest request;
    request.set_service(service);
    reader = stub->Watch(&context, request);
  }

  std::unique_ptr<Health::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader;
};

TEST(GrpcServerTest, DrainEndsHealthWatchStreamsWithNotServing) {
  ParkingService service;
  auto server = GrpcServer::Start({.host = "127.0.0.1", .port = 0}, {{&service, "p"}});
  ASSERT_THAT(server, IsOk());
  HealthWatch health((*server)->port(), "p");
  grpc::ClientReader<HealthCheckResponse>* watch = health.reader.get();
  HealthCheckResponse response;
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);

  // A far deadline: the drain must not wait for the watch to time out.
  std::thread drainer([&] { (*server)->Drain(absl::Now() + absl::Seconds(60)); });
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(watch->Read(&response));
  EXPECT_TRUE(watch->Finish().ok());
  drainer.join();
}

TEST(GrpcServerTest, WatchOfAnUnknownServiceSaysSoAndEndsAtDrain) {
  ParkingService service;
  auto server = GrpcServer::Start({.host = "127.0.0.1", .port = 0}, {{&service, "p"}});
  ASSERT_THAT(server, IsOk());
  HealthWatch health((*server)->port(), "later");
  grpc::ClientReader<HealthCheckResponse>* watch = health.reader.get();
  HealthCheckResponse response;
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVICE_UNKNOWN);
  (*server)->Drain(absl::Now() + absl::Seconds(60));
  // The drain ends the stream even for a service that never existed.
  while (watch->Read(&response)) {
    EXPECT_NE(response.status(), HealthCheckResponse::SERVING);
  }
  EXPECT_TRUE(watch->Finish().ok());
}

}  // namespace
}  // namespace trident
