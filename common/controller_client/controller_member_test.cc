#include "common/controller_client/controller_member.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/controller_client/testing/fake_controller.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace trident::controller_client {
namespace {

namespace v1 = ::trident::v1;
using ::trident::testing::StatusIs;

// Generous: the tests run on loaded machines. Nothing waits this long when
// the code works.
constexpr absl::Duration kWait = absl::Seconds(30);
constexpr absl::Duration kInterval = absl::Milliseconds(20);

v1::RegisterRequest WorkerRegistration(const std::string& id, uint64_t incarnation) {
  v1::RegisterRequest request;
  v1::WorkerRegistration* worker = request.mutable_worker();
  worker->set_worker_id(id);
  worker->set_incarnation(incarnation);
  worker->set_address("127.0.0.1:1");
  worker->set_role(v1::ROLE_DECODE);
  return request;
}

ControllerMemberOptions MemberOptions(const std::string& address, const std::string& id,
                                      uint64_t incarnation = 11) {
  ControllerMemberOptions options;
  options.controller_address = address;
  options.build_registration = [id, incarnation] { return WorkerRegistration(id, incarnation); };
  options.fill_heartbeat = [id](v1::HeartbeatRequest* request) {
    request->set_state(v1::SERVING_STATE_SERVING);
    request->mutable_worker_load()->set_worker_id(id);
    request->mutable_worker_load()->set_role(v1::ROLE_DECODE);
  };
  options.backoff = {.initial = absl::Milliseconds(10), .max = absl::Milliseconds(100)};
  options.seed = 1234;
  return options;
}

std::unique_ptr<FakeControllerServer> StartController(uint64_t incarnation, int port = 0) {
  absl::StatusOr<std::unique_ptr<FakeControllerServer>> server = FakeControllerServer::Start(
      {.controller_incarnation = incarnation, .heartbeat_interval = kInterval}, port);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::unique_ptr<ControllerMember> StartMember(ControllerMemberOptions options) {
  absl::StatusOr<std::unique_ptr<ControllerMember>> member =
      ControllerMember::Create(std::move(options));
  EXPECT_TRUE(member.ok()) << member.status();
  if (!member.ok()) return nullptr;
  (*member)->Start();
  return *std::move(member);
}

// A port nothing listens on (a server was bound there and shut down).
int UnusedPort() {
  std::unique_ptr<FakeControllerServer> server = StartController(1);
  return server == nullptr ? 0 : server->port();
}

TEST(ControllerMemberTest, RegistersThenHeartbeatsAtTheInterval) {
  auto server = StartController(/*incarnation=*/5);
  ASSERT_NE(server, nullptr);
  const absl::Time started = absl::Now();
  auto member = StartMember(MemberOptions(server->address(), "w1", /*incarnation=*/11));
  ASSERT_NE(member, nullptr);

  ASSERT_TRUE(server->controller().Await(
      [](const FakeControllerState& s) { return s.Member("w1").heartbeats >= 6; }, kWait));
  // The member counts a heartbeat once its write completes, which may be
  // after the controller read it.
  ASSERT_TRUE(
      member->Await([](const ControllerMemberStatus& s) { return s.heartbeats_sent >= 6; }, kWait));

  const FakeControllerState state = server->controller().state();
  const FakeMemberRecord& record = state.Member("w1");
  EXPECT_EQ(record.registrations, 1);
  EXPECT_EQ(record.last_registration.worker().role(), v1::ROLE_DECODE);
  EXPECT_EQ(record.last_heartbeat.member_id(), "w1");
  EXPECT_EQ(record.last_heartbeat.incarnation(), 11u);
  EXPECT_EQ(record.last_heartbeat.state(), v1::SERVING_STATE_SERVING);
  EXPECT_EQ(record.last_heartbeat.worker_load().worker_id(), "w1");
  // Paced by the interval, not sent as fast as possible: no more heartbeats
  // arrived than the ticks in the time since the member started, plus the
  // one at registration and one for rounding (late ones never bunch up, as a
  // tick missed is skipped). A slow host only loosens the bound.
  const std::vector<absl::Time>& times = record.heartbeat_times;
  const double ticks = absl::FDivDuration(times.back() - started, kInterval);
  EXPECT_LE(static_cast<double>(times.size()), ticks + 2.0)
      << times.size() << " heartbeats in " << (times.back() - started);
  ASSERT_EQ(state.topology.workers_size(), 1);
  EXPECT_EQ(state.topology.workers(0).registration().worker_id(), "w1");

  const ControllerMemberStatus status = member->status();
  EXPECT_TRUE(status.registered);
  EXPECT_EQ(status.controller_incarnation, 5u);
  EXPECT_EQ(status.registrations, 1);
  EXPECT_EQ(status.heartbeat_interval, kInterval);
  EXPECT_GE(status.heartbeats_sent, 6);
}

TEST(ControllerMemberTest, RegistersAgainWithARestartedController) {
  auto server = StartController(/*incarnation=*/1);
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  auto member = StartMember(MemberOptions(server->address(), "w1"));
  ASSERT_NE(member, nullptr);
  ASSERT_TRUE(server->controller().Await(
      [](const FakeControllerState& s) { return s.Member("w1").heartbeats >= 2; }, kWait));

  // The controller dies and a new one (empty membership, new incarnation)
  // comes up at the same address.
  server.reset();
  server = StartController(/*incarnation=*/2, port);
  ASSERT_NE(server, nullptr);

  ASSERT_TRUE(member->Await(
      [](const ControllerMemberStatus& s) { return s.controller_incarnation == 2; }, kWait));
  ASSERT_TRUE(server->controller().Await(
      [](const FakeControllerState& s) { return s.Member("w1").heartbeats >= 2; }, kWait));
  const ControllerMemberStatus status = member->status();
  EXPECT_EQ(status.registrations, 2);
  EXPECT_EQ(status.controller_restarts, 1);
  EXPECT_TRUE(status.registered);
  EXPECT_EQ(server->controller().state().Member("w1").registrations, 1);
}

TEST(ControllerMemberTest, RegistersAgainWhenAHeartbeatIsAnsweredNotFound) {
  auto server = StartController(/*incarnation=*/3);
  ASSERT_NE(server, nullptr);
  auto member = StartMember(MemberOptions(server->address(), "w1"));
  ASSERT_NE(member, nullptr);
  ASSERT_TRUE(server->controller().Await(
      [](const FakeControllerState& s) { return s.Member("w1").heartbeats >= 1; }, kWait));

  server->controller().Forget("w1");

  ASSERT_TRUE(server->controller().Await(
      [](const FakeControllerState& s) {
        return s.Member("w1").registrations == 2 && s.Member("w1").registered;
      },
      kWait));
  ASSERT_TRUE(
      member->Await([](const ControllerMemberStatus& s) { return s.registrations == 2; }, kWait));
  const ControllerMemberStatus status = member->status();
  EXPECT_THAT(status.last_error, StatusIs(absl::StatusCode::kNotFound));
  // Same controller: not a restart.
  EXPECT_EQ(status.controller_restarts, 0);
  EXPECT_EQ(status.controller_incarnation, 3u);
}

TEST(ControllerMemberTest, RetriesAnUnreachableControllerUntilItComesUp) {
  const int port = UnusedPort();
  ASSERT_NE(port, 0);
  auto member = StartMember(MemberOptions(absl::StrCat("127.0.0.1:", port), "w1"));
  ASSERT_NE(member, nullptr);
  ASSERT_TRUE(member->Await(
      [](const ControllerMemberStatus& s) { return s.failed_registrations >= 3; }, kWait));
  {
    const ControllerMemberStatus status = member->status();
    EXPECT_FALSE(status.registered);
    EXPECT_EQ(status.registrations, 0);
    EXPECT_THAT(status.last_error, StatusIs(absl::StatusCode::kUnavailable));
  }

  auto server = StartController(/*incarnation=*/9, port);
  ASSERT_NE(server, nullptr);

  ASSERT_TRUE(member->Await([](const ControllerMemberStatus& s) { return s.registered; }, kWait));
  ASSERT_TRUE(server->controller().Await(
      [](const FakeControllerState& s) { return s.Member("w1").heartbeats >= 2; }, kWait));
  EXPECT_EQ(member->status().controller_incarnation, 9u);
}

TEST(ControllerMemberTest, StopDeregistersAndEndsTheHeartbeatStream) {
  auto server = StartController(/*incarnation=*/1);
  ASSERT_NE(server, nullptr);
  auto member = StartMember(MemberOptions(server->address(), "w1"));
  ASSERT_NE(member, nullptr);
  ASSERT_TRUE(server->controller().Await(
      [](const FakeControllerState& s) { return s.Member("w1").heartbeats >= 1; }, kWait));

  member->Stop();

  const FakeMemberRecord record = server->controller().state().Member("w1");
  EXPECT_EQ(record.deregistrations, 1);
  EXPECT_FALSE(record.registered);
  EXPECT_EQ(server->controller().state().topology.workers_size(), 0);
  EXPECT_TRUE(server->controller().Await(
      [](const FakeControllerState& s) { return s.open_heartbeat_streams == 0; }, kWait));
  const ControllerMemberStatus status = member->status();
  EXPECT_TRUE(status.deregistered);
  EXPECT_FALSE(status.registered);
  EXPECT_FALSE(status.heartbeating);
  member->Stop();  // Idempotent.
  EXPECT_EQ(server->controller().state().Member("w1").deregistrations, 1);
}

TEST(ControllerMemberTest, StopWithoutAControllerReturnsWithoutDeregistering) {
  const int port = UnusedPort();
  ASSERT_NE(port, 0);
  auto member = StartMember(MemberOptions(absl::StrCat("127.0.0.1:", port), "w1"));
  ASSERT_NE(member, nullptr);
  ASSERT_TRUE(member->Await(
      [](const ControllerMemberStatus& s) { return s.failed_registrations >= 1; }, kWait));

  member->Stop();

  const ControllerMemberStatus status = member->status();
  EXPECT_FALSE(status.deregistered);
  EXPECT_FALSE(status.registered);
}

TEST(ControllerMemberTest, PassesHeartbeatResponsesToTheCallback) {
  auto server = StartController(/*incarnation=*/1);
  ASSERT_NE(server, nullptr);
  absl::Mutex mu;
  std::vector<v1::HeartbeatResponse> received;
  ControllerMemberOptions options = MemberOptions(server->address(), "w1");
  options.on_response = [&](const v1::HeartbeatResponse& response) {
    absl::MutexLock lock(&mu);
    received.push_back(response);
  };
  auto member = StartMember(std::move(options));
  ASSERT_NE(member, nullptr);
  ASSERT_TRUE(server->controller().Await(
      [](const FakeControllerState& s) { return s.Member("w1").heartbeats >= 1; }, kWait));

  v1::HeartbeatResponse directive;
  directive.mutable_set_role()->set_directive_id(4);
  directive.mutable_set_role()->set_role(v1::ROLE_PREFILL);
  ASSERT_EQ(server->controller().SendToMember("w1", directive), 1);

  absl::MutexLock lock(&mu);
  auto arrived = [&]() { return !received.empty(); };
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&arrived), kWait));
  EXPECT_EQ(received[0].set_role().directive_id(), 4u);
  EXPECT_EQ(received[0].set_role().role(), v1::ROLE_PREFILL);
  EXPECT_GE(member->status().responses_received, 1);
}

TEST(ControllerMemberTest, AnInvalidRegistrationFailsLocallyAndIsRetried) {
  auto server = StartController(/*incarnation=*/1);
  ASSERT_NE(server, nullptr);
  ControllerMemberOptions options = MemberOptions(server->address(), "w1");
  options.build_registration = [] { return WorkerRegistration("w1", /*incarnation=*/0); };
  auto member = StartMember(std::move(options));
  ASSERT_NE(member, nullptr);

  ASSERT_TRUE(member->Await(
      [](const ControllerMemberStatus& s) { return s.failed_registrations >= 2; }, kWait));
  EXPECT_THAT(member->status().last_error, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(server->controller().state().Member("w1").registrations, 0);
}

TEST(ControllerMemberTest, CreateRejectsIncompleteOptions) {
  ControllerMemberOptions no_address = MemberOptions("", "w1");
  EXPECT_THAT(ControllerMember::Create(no_address).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ControllerMemberOptions no_builder = MemberOptions("127.0.0.1:1", "w1");
  no_builder.build_registration = nullptr;
  EXPECT_THAT(ControllerMember::Create(no_builder).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(MemberIdentityTest, ReadsTheIdOfEitherKindAndRejectsIncompleteOnes) {
  std::string id;
  uint64_t incarnation = 0;
  v1::RegisterRequest attention;
  attention.mutable_attention()->set_service_id("a1");
  attention.mutable_attention()->set_incarnation(3);
  ASSERT_TRUE(MemberIdentity(attention, &id, &incarnation).ok());
  EXPECT_EQ(id, "a1");
  EXPECT_EQ(incarnation, 3u);
  EXPECT_THAT(MemberIdentity(v1::RegisterRequest(), &id, &incarnation),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(MemberIdentity(WorkerRegistration("", 1), &id, &incarnation),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace trident::controller_client
