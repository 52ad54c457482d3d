#include "services/controller/balancer/role_balancer.h"

#include <memory>
#include <vector>

#include "common/testing/status_matchers.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "services/controller/prometheus/fake_metrics_source.h"

namespace trident::controller {
namespace {

namespace v1 = ::trident::v1;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;

// Holds every SetRole until the test answers it.
class FakeRoleSetter final : public RoleSetter {
 public:
  void SetRole(const std::string& address, const v1::SetRoleRequest& request,
               Done done) override {
    addresses.push_back(address);
    requests.push_back(request);
    pending.push_back(std::move(done));
  }
  void Answer(absl::StatusOr<v1::SetRoleResponse> result) {
    Done done = std::move(pending.front());
    pending.erase(pending.begin());
    done(std::move(result));
  }

  std::vector<std::string> addresses;
  std::vector<v1::SetRoleRequest> requests;
  std::vector<Done> pending;
};

class RoleBalancerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MembershipOptions membership_options;
    membership_options.controller_incarnation = 42;
    membership_options.heartbeat_interval = absl::Seconds(1);
    membership_options.dead_after = absl::Minutes(10);
    membership_ = *Membership::Create(membership_options, &clock_);
    for (const auto& [id, role] : std::vector<std::pair<std::string, v1::Role>>{
             {"p0", v1::ROLE_PREFILL}, {"p1", v1::ROLE_PREFILL}, {"d0", v1::ROLE_DECODE}}) {
      v1::RegisterRequest request;
      request.mutable_worker()->set_worker_id(id);
      request.mutable_worker()->set_incarnation(7);
      request.mutable_worker()->set_address(id + ".local:1");
      request.mutable_worker()->set_role(role);
      ASSERT_THAT(membership_->Register(request).status(), IsOk());
    }
    options_.policy.interval = absl::Seconds(1);
    options_.policy.min_dwell = absl::Seconds(5);
    options_.policy.sustain_intervals = 2;
    options_.drain_timeout = absl::Seconds(4);
  }

  std::unique_ptr<RoleBalancer> Make(MetricsSource* source) {
    absl::StatusOr<std::unique_ptr<RoleBalancer>> balancer = RoleBalancer::Create(
        options_, membership_.get(), source, &setter_, &metrics_, &clock_);
    EXPECT_THAT(balancer.status(), IsOk());
    return std::move(*balancer);
  }

  // Decode overloaded (TPOT twice its SLO), prefill idle.
  void PublishDecodeOverload(FakeMetricsSource& source) {
    const SignalQueries& q = options_.queries;
    for (const char* w : {"p0", "p1", "d0"}) {
      source.Set(q.queued_prefill_tokens_by_worker, 0, {{"worker", w}});
      source.Set(q.kv_usage_ratio_by_worker, 0.3, {{"worker", w}});
    }
    source.Set(q.prefill_tokens_per_second_per_worker, 10000);
    source.Set(q.ttft_p90_seconds, 0.05);
    source.Set(q.tpot_p90_seconds, 0.1);
    source.Set(q.requests_per_second, 10);
    source.Set(q.ttft_rejections_per_second, 0);
    source.Set(q.decode_rejections_per_second, 0);
    source.Set(q.decode_waiting_sequences, 0);
  }

  void Beat(const std::string& id, v1::Role role) {
    v1::HeartbeatRequest beat;
    beat.set_member_id(id);
    beat.set_incarnation(7);
    beat.set_state(v1::SERVING_STATE_SERVING);
    beat.mutable_worker_load()->set_role(role);
    ASSERT_THAT(membership_->Heartbeat(beat), IsOk());
  }

  // Runs intervals until one flips; at most `limit`.
  int RunUntilFlip(RoleBalancer& balancer, FakeMetricsSource& source, int limit) {
    for (int i = 1; i <= limit; ++i) {
      clock_.Advance(absl::Seconds(1));
      PublishDecodeOverload(source);
      if (balancer.RunInterval().action == Decision::Action::kFlip) return i;
    }
    return -1;
  }

  std::string Metrics() {
    return prometheus::TextSerializer().Serialize(registry_.Collect());
  }

  FakeClock clock_{absl::FromUnixSeconds(10000)};
  std::unique_ptr<Membership> membership_;
  RoleBalancerOptions options_;
  FakeRoleSetter setter_;
  prometheus::Registry registry_;
  ControllerMetrics metrics_{registry_};
};

TEST_F(RoleBalancerTest, WithoutPrometheusEveryIntervalHoldsSayingWhy) {
  std::unique_ptr<RoleBalancer> balancer = Make(nullptr);
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Seconds(1));
    const Decision decision = balancer->RunInterval();
    EXPECT_EQ(decision.action, Decision::Action::kHold);
    EXPECT_EQ(decision.reason, DecisionReason::kMetricsUnavailable);
    EXPECT_THAT(decision.detail, HasSubstr("--prometheus_url"));
  }
  EXPECT_TRUE(setter_.requests.empty());
  const v1::ControllerStatus status = balancer->Status(2);
  EXPECT_EQ(status.controller_incarnation(), 42u);
  ASSERT_EQ(status.decisions_size(), 2);
  EXPECT_EQ(status.decisions(0).reason(), "metrics_unavailable");
  EXPECT_FALSE(status.decisions(0).flip());
  EXPECT_THAT(Metrics(), HasSubstr("trident_controller_decision_total{action=\"hold\","
                                   "reason=\"metrics_unavailable\"} 3"));
}

TEST_F(RoleBalancerTest, FlipIsPendingUntilTheWorkerReportsItsNewRole) {
  FakeMetricsSource source(&clock_);
  std::unique_ptr<RoleBalancer> balancer = Make(&source);
  clock_.Advance(absl::Seconds(10));  // past the dwell of the registrations
  const int n = RunUntilFlip(*balancer, source, 20);
  ASSERT_GT(n, 0) << "decode overload never moved a worker";
  ASSERT_EQ(setter_.requests.size(), 1u);
  const v1::SetRoleRequest& request = setter_.requests[0];
  EXPECT_EQ(request.role(), v1::ROLE_DECODE);
  EXPECT_EQ(request.directive_id(), 1u);
  EXPECT_EQ(request.drain_timeout().seconds(), 4);
  EXPECT_EQ(request.reason(), "decode_pressure");
  const std::string flipped = setter_.addresses[0].substr(0, 2);
  EXPECT_EQ(setter_.addresses[0], flipped + ".local:1");
  // The topology announces the pending role at once.
  const v1::Topology topology = membership_->Snapshot();
  for (const v1::WorkerEntry& w : topology.workers()) {
    EXPECT_EQ(w.pending_role(), w.registration().worker_id() == flipped ? v1::ROLE_DECODE
                                                                        : v1::ROLE_UNSPECIFIED);
  }
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(balancer->RunInterval().reason, DecisionReason::kFlipPending);
  v1::SetRoleResponse response;
  response.set_previous_role(v1::ROLE_PREFILL);
  response.set_role(v1::ROLE_DECODE);
  setter_.Answer(response);
  // Answered, but the worker's heartbeat has not shown the role yet.
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(balancer->RunInterval().reason, DecisionReason::kFlipPending);
  Beat(flipped, v1::ROLE_DECODE);
  clock_.Advance(absl::Seconds(1));
  PublishDecodeOverload(source);
  EXPECT_NE(balancer->RunInterval().reason, DecisionReason::kFlipPending);
  EXPECT_EQ(balancer->flips(), 1);
  EXPECT_THAT(Metrics(), HasSubstr("trident_controller_role_flips_total{from=\"prefill\","
                                   "to=\"decode\"} 1"));
  EXPECT_THAT(Metrics(), HasSubstr("trident_controller_flip_pending 0"));
  EXPECT_EQ(balancer->Status(0).flips_total(), 1);
  // Now one prefill worker is left: the policy never takes the last one.
  for (int i = 0; i < 20; ++i) {
    clock_.Advance(absl::Seconds(1));
    PublishDecodeOverload(source);
    EXPECT_EQ(balancer->RunInterval().action, Decision::Action::kHold);
  }
  EXPECT_EQ(setter_.requests.size(), 1u);
}

TEST_F(RoleBalancerTest, FailedSetRoleWithdrawsTheOrderAndCountsIt) {
  FakeMetricsSource source(&clock_);
  std::unique_ptr<RoleBalancer> balancer = Make(&source);
  clock_.Advance(absl::Seconds(10));
  ASSERT_GT(RunUntilFlip(*balancer, source, 20), 0);
  setter_.Answer(absl::UnavailableError("worker gone"));
  const v1::Topology topology = membership_->Snapshot();
  for (const v1::WorkerEntry& w : topology.workers()) {
    EXPECT_EQ(w.pending_role(), v1::ROLE_UNSPECIFIED);
  }
  clock_.Advance(absl::Seconds(1));
  PublishDecodeOverload(source);
  EXPECT_NE(balancer->RunInterval().reason, DecisionReason::kFlipPending);
  EXPECT_EQ(balancer->flips(), 0);
  EXPECT_THAT(Metrics(), HasSubstr("trident_controller_flip_failures_total 1"));
}

TEST_F(RoleBalancerTest, PrometheusDownHoldsAndNeverFlips) {
  FakeMetricsSource source(&clock_);
  source.SetError(absl::UnavailableError("connection refused"));
  std::unique_ptr<RoleBalancer> balancer = Make(&source);
  clock_.Advance(absl::Seconds(10));
  for (int i = 0; i < 30; ++i) {
    clock_.Advance(absl::Seconds(1));
    EXPECT_EQ(balancer->RunInterval().reason, DecisionReason::kMetricsUnavailable);
  }
  EXPECT_TRUE(setter_.requests.empty());
}

TEST_F(RoleBalancerTest, MembersGaugeFollowsTheTopology) {
  metrics_.UpdateMembers(membership_->Snapshot());
  const std::string text = Metrics();
  EXPECT_THAT(text, HasSubstr("trident_controller_members{kind=\"worker\",role=\"prefill\","
                              "state=\"serving\"} 2"));
  EXPECT_THAT(text, HasSubstr("trident_controller_members{kind=\"worker\",role=\"decode\","
                              "state=\"serving\"} 1"));
  EXPECT_THAT(text, HasSubstr("trident_controller_members{kind=\"worker\",role=\"both\","
                              "state=\"dead\"} 0"));
}

}  // namespace
}  // namespace trident::controller
