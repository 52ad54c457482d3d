#include "common/grpc/async_unary.h"

#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/grpc/test_service.grpc.pb.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::Parking;
using ::trident::testing::ParkRequest;
using ::trident::testing::ParkResponse;
using ::trident::testing::StatusIs;

// Answers each call with `answer`, or holds it until the client cancels
// (its deadline) when `hold` is set.
class ParkingService final : public Parking::CallbackService {
 public:
  grpc::Status answer = grpc::Status::OK;
  bool hold = false;

  grpc::ServerUnaryReactor* Park(grpc::CallbackServerContext* context, const ParkRequest*,
                                 ParkResponse*) override {
    if (!hold) {
      grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
      reactor->Finish(answer);
      return reactor;
    }
    return new HeldReactor();
  }

 private:
  class HeldReactor final : public grpc::ServerUnaryReactor {
   public:
    void OnCancel() override { Finish(grpc::Status::CANCELLED); }
    void OnDone() override { delete this; }
  };
};

// Keeps gRPC initialised for the whole binary. Each test's server and
// channel otherwise take gRPC's last reference with them, and its shutdown
// would race the callback thread still unwinding the test's last call.
class GrpcForTheBinary : public ::testing::Environment {
 public:
  void SetUp() override { grpc_init(); }
};
const auto* const kGrpcForTheBinary = ::testing::AddGlobalTestEnvironment(new GrpcForTheBinary);

class CallUnaryAsyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = Parking::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                                 grpc::InsecureChannelCredentials()));
  }

  void TearDown() override { server_->Shutdown(); }

  // One call; waits for `done` and returns what it got, counting its runs.
  absl::StatusOr<ParkResponse> Call(absl::Duration timeout) {
    absl::Notification finished;
    absl::StatusOr<ParkResponse> got = absl::UnknownError("done never ran");
    CallUnaryAsync<ParkResponse>(
        ParkRequest(), timeout,
        [stub = stub_.get()](grpc::ClientContext* context, const ParkRequest* request,
                             ParkResponse* response, std::function<void(grpc::Status)> on_done) {
          stub->async()->Park(context, request, response, std::move(on_done));
        },
        [&](absl::StatusOr<ParkResponse> answer) {
          got = std::move(answer);
          runs_.fetch_add(1);
          finished.Notify();
        });
    finished.WaitForNotification();
    return got;
  }

  ParkingService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Parking::Stub> stub_;
  std::atomic<int> runs_{0};
};

TEST_F(CallUnaryAsyncTest, DeliversTheResponse) {
  EXPECT_THAT(Call(absl::Seconds(30)).status(), IsOk());
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(CallUnaryAsyncTest, DeliversTheServersStatus) {
  service_.answer = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "budget full");
  EXPECT_THAT(Call(absl::Seconds(30)).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "budget full"));
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(CallUnaryAsyncTest, EndsAtItsDeadline) {
  service_.hold = true;
  EXPECT_THAT(Call(absl::Milliseconds(100)).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(runs_.load(), 1);
}

TEST_F(CallUnaryAsyncTest, ReportsAnUnreachableServer) {
  server_->Shutdown();
  EXPECT_THAT(Call(absl::Seconds(30)).status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(runs_.load(), 1);
}

}  // namespace
}  // namespace trident
