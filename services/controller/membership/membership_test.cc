#include "services/controller/membership/membership.h"

#include <vector>

#include "common/testing/status_matchers.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::controller {
namespace {

namespace v1 = ::trident::v1;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;

v1::RegisterRequest WorkerRequest(const std::string& id, uint64_t incarnation, v1::Role role) {
  v1::RegisterRequest request;
  v1::WorkerRegistration* w = request.mutable_worker();
  w->set_worker_id(id);
  w->set_incarnation(incarnation);
  w->set_address(id + ":50052");
  w->set_role(role);
  return request;
}

v1::RegisterRequest AttentionRequest(const std::string& id, uint64_t incarnation) {
  v1::RegisterRequest request;
  v1::AttentionRegistration* a = request.mutable_attention();
  a->set_service_id(id);
  a->set_incarnation(incarnation);
  a->set_address(id + ":50053");
  return request;
}

v1::HeartbeatRequest WorkerBeat(const std::string& id, uint64_t incarnation, v1::Role role,
                                v1::ServingState state = v1::SERVING_STATE_SERVING,
                                v1::Role pending = v1::ROLE_UNSPECIFIED) {
  v1::HeartbeatRequest beat;
  beat.set_member_id(id);
  beat.set_incarnation(incarnation);
  beat.set_state(state);
  beat.mutable_worker_load()->set_worker_id(id);
  beat.mutable_worker_load()->set_role(role);
  beat.mutable_worker_load()->set_pending_role(pending);
  beat.mutable_worker_load()->set_running_sequences(3);
  return beat;
}

class MembershipTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MembershipOptions options;
    options.heartbeat_interval = absl::Seconds(1);
    options.dead_after = absl::Seconds(3);
    options.controller_incarnation = 77;
    absl::StatusOr<std::unique_ptr<Membership>> created = Membership::Create(options, &clock_);
    ASSERT_THAT(created.status(), IsOk());
    membership_ = std::move(*created);
  }

  FakeClock clock_{absl::FromUnixSeconds(1000)};
  std::unique_ptr<Membership> membership_;
};

TEST(MembershipOptionsTest, RejectsBadOptions) {
  MembershipOptions options;
  options.controller_incarnation = 0;
  EXPECT_THAT(ValidateMembershipOptions(options).message(), HasSubstr("controller_incarnation"));
  options.controller_incarnation = 1;
  options.dead_after = options.heartbeat_interval;
  EXPECT_THAT(ValidateMembershipOptions(options).message(), HasSubstr("dead_after"));
}

TEST_F(MembershipTest, RegisterAnswersTermsAndAddsWorker) {
  absl::StatusOr<v1::RegisterResponse> response =
      membership_->Register(WorkerRequest("w0", 5, v1::ROLE_PREFILL));
  ASSERT_THAT(response.status(), IsOk());
  EXPECT_EQ(response->controller_incarnation(), 77u);
  EXPECT_EQ(response->heartbeat_interval().seconds(), 1);
  EXPECT_EQ(response->dead_after().seconds(), 3);
  const v1::Topology topology = membership_->Snapshot();
  ASSERT_EQ(topology.workers_size(), 1);
  EXPECT_EQ(topology.workers(0).role(), v1::ROLE_PREFILL);
  EXPECT_EQ(topology.workers(0).state(), v1::SERVING_STATE_SERVING);
  EXPECT_EQ(topology.controller_incarnation(), 77u);
}

TEST_F(MembershipTest, RejectsBadRegistrationsNamingTheField) {
  EXPECT_THAT(membership_->Register(v1::RegisterRequest()).status().message(), HasSubstr("member"));
  EXPECT_THAT(membership_->Register(WorkerRequest("", 5, v1::ROLE_PREFILL)).status().message(),
              HasSubstr("worker.worker_id"));
  EXPECT_THAT(membership_->Register(WorkerRequest("a b", 5, v1::ROLE_PREFILL)).status().message(),
              HasSubstr("printable"));
  EXPECT_THAT(membership_->Register(WorkerRequest("w", 0, v1::ROLE_PREFILL)).status().message(),
              HasSubstr("incarnation"));
  EXPECT_THAT(membership_->Register(WorkerRequest("w", 1, v1::ROLE_UNSPECIFIED)).status().message(),
              HasSubstr("worker.role"));
  EXPECT_EQ(membership_->Register(WorkerRequest(std::string(129, 'x'), 1, v1::ROLE_DECODE))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(membership_->Snapshot().workers_size(), 0);
}

TEST_F(MembershipTest, SameIncarnationIsIdempotentNewOneReplaces) {
  ASSERT_THAT(membership_->Register(WorkerRequest("w0", 5, v1::ROLE_PREFILL)).status(), IsOk());
  const uint64_t v1_version = membership_->Snapshot().version();
  ASSERT_THAT(membership_->Register(WorkerRequest("w0", 5, v1::ROLE_PREFILL)).status(), IsOk());
  EXPECT_EQ(membership_->Snapshot().version(), v1_version);
  ASSERT_THAT(membership_->Register(WorkerRequest("w0", 6, v1::ROLE_DECODE)).status(), IsOk());
  const v1::Topology topology = membership_->Snapshot();
  EXPECT_GT(topology.version(), v1_version);
  ASSERT_EQ(topology.workers_size(), 1);
  EXPECT_EQ(topology.workers(0).registration().incarnation(), 6u);
  EXPECT_EQ(topology.workers(0).role(), v1::ROLE_DECODE);
  // The old process's heartbeats are refused.
  EXPECT_EQ(membership_->Heartbeat(WorkerBeat("w0", 5, v1::ROLE_PREFILL)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(MembershipTest, HeartbeatOfUnknownMemberIsNotFound) {
  const absl::Status status = membership_->Heartbeat(WorkerBeat("ghost", 1, v1::ROLE_DECODE));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("register again"));
}

TEST_F(MembershipTest, HeartbeatRejectsWrongLoadKindAndState) {
  ASSERT_THAT(membership_->Register(WorkerRequest("w0", 5, v1::ROLE_PREFILL)).status(), IsOk());
  ASSERT_THAT(membership_->Register(AttentionRequest("a0", 9)).status(), IsOk());
  v1::HeartbeatRequest beat = WorkerBeat("a0", 9, v1::ROLE_DECODE);
  EXPECT_EQ(membership_->Heartbeat(beat).code(), absl::StatusCode::kInvalidArgument);
  beat = WorkerBeat("w0", 5, v1::ROLE_PREFILL, v1::SERVING_STATE_DEAD);
  EXPECT_EQ(membership_->Heartbeat(beat).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MembershipTest, SilentMembersTurnDeadAndComeBack) {
  ASSERT_THAT(membership_->Register(WorkerRequest("w0", 5, v1::ROLE_PREFILL)).status(), IsOk());
  ASSERT_THAT(membership_->Register(AttentionRequest("a0", 9)).status(), IsOk());
  clock_.Advance(absl::Seconds(2));
  ASSERT_THAT(membership_->Heartbeat(WorkerBeat("w0", 5, v1::ROLE_PREFILL)), IsOk());
  EXPECT_EQ(membership_->ExpireSilent(), 0);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(membership_->ExpireSilent(), 1);  // a0: 3 s silent
  v1::Topology topology = membership_->Snapshot();
  EXPECT_EQ(topology.attention_services(0).state(), v1::SERVING_STATE_DEAD);
  EXPECT_EQ(topology.workers(0).state(), v1::SERVING_STATE_SERVING);
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(membership_->ExpireSilent(), 1);  // w0
  EXPECT_EQ(membership_->ExpireSilent(), 0);  // once
  ASSERT_THAT(membership_->Heartbeat(WorkerBeat("w0", 5, v1::ROLE_PREFILL)), IsOk());
  EXPECT_EQ(membership_->Snapshot().workers(0).state(), v1::SERVING_STATE_SERVING);
  EXPECT_FALSE(membership_->PolicyWorkers().empty());
}

TEST_F(MembershipTest, RoleFlipShowsPendingThenNewRole) {
  ASSERT_THAT(membership_->Register(WorkerRequest("w0", 5, v1::ROLE_PREFILL)).status(), IsOk());
  clock_.Advance(absl::Seconds(1));
  ASSERT_THAT(membership_->SetOrderedRole("w0", v1::ROLE_DECODE), IsOk());
  v1::Topology topology = membership_->Snapshot();
  EXPECT_EQ(topology.workers(0).pending_role(), v1::ROLE_DECODE);
  std::vector<WorkerState> workers = membership_->PolicyWorkers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_FALSE(workers[0].serving);
  // The worker drains, then reports the new role.
  ASSERT_THAT(membership_->Heartbeat(WorkerBeat("w0", 5, v1::ROLE_PREFILL,
                                                v1::SERVING_STATE_DRAINING, v1::ROLE_DECODE)),
              IsOk());
  EXPECT_EQ(membership_->Snapshot().workers(0).state(), v1::SERVING_STATE_DRAINING);
  clock_.Advance(absl::Seconds(1));
  ASSERT_THAT(membership_->Heartbeat(WorkerBeat("w0", 5, v1::ROLE_DECODE)), IsOk());
  topology = membership_->Snapshot();
  EXPECT_EQ(topology.workers(0).role(), v1::ROLE_DECODE);
  EXPECT_EQ(topology.workers(0).pending_role(), v1::ROLE_UNSPECIFIED);
  workers = membership_->PolicyWorkers();
  EXPECT_TRUE(workers[0].serving);
  EXPECT_EQ(workers[0].role_change_time, absl::FromUnixSeconds(1002));
  EXPECT_EQ(workers[0].load, 3);
}

TEST_F(MembershipTest, FailedOrderClearsPendingRole) {
  ASSERT_THAT(membership_->Register(WorkerRequest("w0", 5, v1::ROLE_PREFILL)).status(), IsOk());
  ASSERT_THAT(membership_->SetOrderedRole("w0", v1::ROLE_DECODE), IsOk());
  ASSERT_THAT(membership_->SetOrderedRole("w0", v1::ROLE_UNSPECIFIED), IsOk());
  EXPECT_EQ(membership_->Snapshot().workers(0).pending_role(), v1::ROLE_UNSPECIFIED);
  EXPECT_EQ(membership_->SetOrderedRole("nobody", v1::ROLE_DECODE).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(MembershipTest, ListenersSeeEveryChangeInVersionOrderLoadAloneIsNoChange) {
  std::vector<uint64_t> versions;
  const int64_t id =
      membership_->AddListener([&](const v1::Topology& t) { versions.push_back(t.version()); });
  ASSERT_THAT(membership_->Register(WorkerRequest("w0", 5, v1::ROLE_PREFILL)).status(), IsOk());
  // Load alone, then a role change.
  ASSERT_THAT(membership_->Heartbeat(WorkerBeat("w0", 5, v1::ROLE_PREFILL)), IsOk());
  ASSERT_THAT(membership_->Heartbeat(WorkerBeat("w0", 5, v1::ROLE_DECODE)), IsOk());
  v1::DeregisterRequest deregister;
  deregister.set_member_id("w0");
  deregister.set_incarnation(5);
  ASSERT_THAT(membership_->Deregister(deregister), IsOk());
  membership_->RemoveListener(id);
  ASSERT_THAT(membership_->Register(WorkerRequest("w1", 5, v1::ROLE_PREFILL)).status(), IsOk());
  ASSERT_EQ(versions.size(), 3u);
  EXPECT_LT(versions[0], versions[1]);
  EXPECT_LT(versions[1], versions[2]);
  EXPECT_EQ(membership_->Snapshot().workers_size(), 1);
}

TEST_F(MembershipTest, DeregisterChecksIncarnation) {
  ASSERT_THAT(membership_->Register(AttentionRequest("a0", 9)).status(), IsOk());
  v1::DeregisterRequest request;
  request.set_member_id("a0");
  request.set_incarnation(8);
  EXPECT_EQ(membership_->Deregister(request).code(), absl::StatusCode::kFailedPrecondition);
  request.set_member_id("zz");
  EXPECT_EQ(membership_->Deregister(request).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(membership_->Snapshot().attention_services_size(), 1);
}

TEST_F(MembershipTest, WorkerAddressIsKnownByRegistration) {
  ASSERT_THAT(membership_->Register(WorkerRequest("w0", 5, v1::ROLE_PREFILL)).status(), IsOk());
  absl::StatusOr<std::string> address = membership_->WorkerAddress("w0");
  ASSERT_THAT(address.status(), IsOk());
  EXPECT_EQ(*address, "w0:50052");
  EXPECT_EQ(membership_->WorkerAddress("w9").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace trident::controller
