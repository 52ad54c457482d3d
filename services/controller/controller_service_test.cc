// The controller's gRPC service on a real server (port 0): registration,
// heartbeat streams, topology watches, silence turning into DEAD (the
// membership's clock is a fake the test moves), and GetStatus.

#include <memory>
#include <string>

#include "common/grpc/server.h"
#include "common/testing/status_matchers.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "services/controller/controller_server.h"
#include "trident/v1/controller.grpc.pb.h"

namespace trident::controller {
namespace {

namespace v1 = ::trident::v1;
using ::testing::HasSubstr;

v1::RegisterRequest Worker(const std::string& id, uint64_t incarnation) {
  v1::RegisterRequest request;
  request.mutable_worker()->set_worker_id(id);
  request.mutable_worker()->set_incarnation(incarnation);
  request.mutable_worker()->set_address("127.0.0.1:1");
  request.mutable_worker()->set_role(v1::ROLE_DECODE);
  return request;
}

class ControllerServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ControllerServerOptions options;
    options.membership.heartbeat_interval = absl::Milliseconds(20);
    options.membership.dead_after = absl::Seconds(3);
    options.membership.controller_incarnation = 99;
    options.balancer.policy.interval = absl::Milliseconds(20);
    absl::StatusOr<std::unique_ptr<ControllerServer>> server =
        ControllerServer::Create(options, registry_, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    controller_ = std::move(*server);
    absl::StatusOr<std::unique_ptr<GrpcServer>> grpc_server =
        GrpcServer::Start({.host = "127.0.0.1", .port = 0}, controller_->services());
    ASSERT_TRUE(grpc_server.ok()) << grpc_server.status();
    server_ = std::move(*grpc_server);
    stub_ = v1::Controller::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(server_->port()), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (server_) server_->Drain(absl::Now());
  }

  grpc::Status Register(const v1::RegisterRequest& request, v1::RegisterResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    return stub_->Register(&context, request, response);
  }

  FakeClock clock_{absl::FromUnixSeconds(5000)};
  prometheus::Registry registry_;
  std::unique_ptr<ControllerServer> controller_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<v1::Controller::Stub> stub_;
};

TEST_F(ControllerServiceTest, RegisterAnswersTermsAndRejectsBadFields) {
  v1::RegisterResponse response;
  ASSERT_TRUE(Register(Worker("w0", 1), &response).ok());
  EXPECT_EQ(response.controller_incarnation(), 99u);
  EXPECT_EQ(response.dead_after().seconds(), 3);
  const grpc::Status bad = Register(Worker("", 1), &response);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("worker.worker_id"));
  grpc::ClientContext context;
  v1::Topology topology;
  ASSERT_TRUE(stub_->GetTopology(&context, v1::GetTopologyRequest(), &topology).ok());
  ASSERT_EQ(topology.workers_size(), 1);
  EXPECT_EQ(topology.workers(0).registration().worker_id(), "w0");
}

TEST_F(ControllerServiceTest, HeartbeatOfUnknownMemberEndsStreamWithNotFound) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  auto stream = stub_->Heartbeat(&context);
  v1::HeartbeatRequest beat;
  beat.set_member_id("ghost");
  beat.set_incarnation(1);
  beat.set_state(v1::SERVING_STATE_SERVING);
  beat.mutable_worker_load();
  ASSERT_TRUE(stream->Write(beat));
  v1::HeartbeatResponse response;
  EXPECT_FALSE(stream->Read(&response));
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("register again"));
}

TEST_F(ControllerServiceTest, HeartbeatsKeepAMemberAndReportItsRole) {
  v1::RegisterResponse registered;
  ASSERT_TRUE(Register(Worker("w0", 1), &registered).ok());
  grpc::ClientContext context;
  auto stream = stub_->Heartbeat(&context);
  v1::HeartbeatRequest beat;
  beat.set_member_id("w0");
  beat.set_incarnation(1);
  beat.set_state(v1::SERVING_STATE_DRAINING);
  beat.mutable_worker_load()->set_role(v1::ROLE_DECODE);
  beat.mutable_worker_load()->set_pending_role(v1::ROLE_PREFILL);
  ASSERT_TRUE(stream->Write(beat));
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
  const v1::Topology topology = controller_->membership().Snapshot();
  EXPECT_EQ(topology.workers(0).state(), v1::SERVING_STATE_DRAINING);
  EXPECT_EQ(topology.workers(0).pending_role(), v1::ROLE_PREFILL);
}

TEST_F(ControllerServiceTest, WatchSendsCurrentThenEveryChangeIncludingDeath) {
  v1::RegisterResponse registered;
  ASSERT_TRUE(Register(Worker("w0", 1), &registered).ok());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  v1::WatchTopologyRequest request;
  request.set_watcher_id("test");
  auto stream = stub_->WatchTopology(&context, request);
  v1::Topology first;
  ASSERT_TRUE(stream->Read(&first));
  EXPECT_EQ(first.controller_incarnation(), 99u);
  ASSERT_EQ(first.workers_size(), 1);
  ASSERT_TRUE(Register(Worker("w1", 1), &registered).ok());
  v1::Topology second;
  ASSERT_TRUE(stream->Read(&second));
  EXPECT_GT(second.version(), first.version());
  EXPECT_EQ(second.workers_size(), 2);
  // Silence past dead_after on the membership's clock: the loop marks both
  // DEAD, and the watch says so.
  clock_.Advance(absl::Seconds(4));
  v1::Topology third;
  ASSERT_TRUE(stream->Read(&third));
  EXPECT_GT(third.version(), second.version());
  for (const v1::WorkerEntry& w : third.workers()) {
    EXPECT_EQ(w.state(), v1::SERVING_STATE_DEAD) << w.registration().worker_id();
  }
  context.TryCancel();
}

TEST_F(ControllerServiceTest, WatchSkipsTheTopologyTheCallerAlreadyHas) {
  v1::RegisterResponse registered;
  ASSERT_TRUE(Register(Worker("w0", 1), &registered).ok());
  const v1::Topology now = controller_->membership().Snapshot();
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  v1::WatchTopologyRequest request;
  request.set_known_controller_incarnation(now.controller_incarnation());
  request.set_known_version(now.version());
  auto stream = stub_->WatchTopology(&context, request);
  ASSERT_TRUE(Register(Worker("w1", 1), &registered).ok());
  v1::Topology next;
  ASSERT_TRUE(stream->Read(&next));
  EXPECT_GT(next.version(), now.version());
  EXPECT_EQ(next.workers_size(), 2);
  context.TryCancel();
}

TEST_F(ControllerServiceTest, GetStatusReportsDecisionsAndValidatesItsLimit) {
  grpc::ClientContext context;
  v1::GetControllerStatusRequest request;
  request.set_max_decisions(5000);
  v1::ControllerStatus status;
  const grpc::Status bad = stub_->GetStatus(&context, request, &status);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("max_decisions"));
  // The loop decides every 20 ms; without Prometheus each interval holds.
  request.set_max_decisions(1);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  do {
    grpc::ClientContext poll;
    ASSERT_TRUE(stub_->GetStatus(&poll, request, &status).ok());
  } while (status.decisions_size() == 0 && absl::Now() < deadline);
  EXPECT_EQ(status.controller_incarnation(), 99u);
  ASSERT_EQ(status.decisions_size(), 1);
  EXPECT_EQ(status.decisions(0).reason(), "metrics_unavailable");
  EXPECT_TRUE(status.prometheus_url().empty());
}

}  // namespace
}  // namespace trident::controller
