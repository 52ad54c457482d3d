#include "services/worker/worker_role.h"

#include <array>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/status/error_details.h"
#include "common/telemetry/collected_series.h"
#include "common/testing/status_matchers.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace trident::worker {
namespace {

namespace v1 = ::trident::v1;

using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::Optional;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

// A FakeClock is only noticed by a waiting change when it re-reads it.
WorkerRoleOptions FakeClockOptions() {
  WorkerRoleOptions options;
  options.clock_recheck_interval = absl::Milliseconds(1);
  return options;
}

// A piece of work whose abort hook records why and ends it (as a service's
// hook makes its call end), from whichever thread calls it.
class FakeCall {
 public:
  // Admits the call; the test fails if the role refuses.
  FakeCall(WorkerRole& role, Capability capability, const std::string& id, bool end_on_abort = true)
      : state_(std::make_shared<State>()) {
    std::weak_ptr<State> weak = state_;
    auto admitted = role.Admit(capability, id, [weak, end_on_abort](const absl::Status& why) {
      std::shared_ptr<State> s = weak.lock();
      if (s == nullptr) return;
      WorkerRole::Work ending;
      {
        absl::MutexLock lock(&s->mu);
        s->why = why;
        ++s->aborts;
        if (end_on_abort) ending = std::move(s->work);
      }
      s->aborted.Notify();
    });
    EXPECT_THAT(admitted.status(), IsOk());
    if (admitted.ok()) {
      absl::MutexLock lock(&state_->mu);
      state_->work = *std::move(admitted);
    }
  }

  void End() {
    WorkerRole::Work ending;
    absl::MutexLock lock(&state_->mu);
    ending = std::move(state_->work);
  }
  absl::Status why() const {
    absl::MutexLock lock(&state_->mu);
    return state_->why;
  }
  int aborts() const {
    absl::MutexLock lock(&state_->mu);
    return state_->aborts;
  }
  absl::Notification& aborted() { return state_->aborted; }

 private:
  struct State {
    mutable absl::Mutex mu;
    WorkerRole::Work work ABSL_GUARDED_BY(mu);
    absl::Status why ABSL_GUARDED_BY(mu);
    int aborts ABSL_GUARDED_BY(mu) = 0;
    absl::Notification aborted;
  };
  std::shared_ptr<State> state_;
};

RoleChange To(v1::Role role, absl::Duration drain_timeout = absl::Seconds(30),
              uint64_t directive_id = 0) {
  return RoleChange{.role = role, .drain_timeout = drain_timeout, .directive_id = directive_id};
}

TEST(RoleHasTest, MapsRolesToCapabilities) {
  EXPECT_TRUE(RoleHas(v1::ROLE_PREFILL, Capability::kPrefill));
  EXPECT_FALSE(RoleHas(v1::ROLE_PREFILL, Capability::kDecode));
  EXPECT_FALSE(RoleHas(v1::ROLE_PREFILL, Capability::kColocated));
  EXPECT_FALSE(RoleHas(v1::ROLE_DECODE, Capability::kPrefill));
  EXPECT_TRUE(RoleHas(v1::ROLE_DECODE, Capability::kDecode));
  EXPECT_FALSE(RoleHas(v1::ROLE_DECODE, Capability::kColocated));
  for (Capability c : {Capability::kPrefill, Capability::kDecode, Capability::kColocated}) {
    EXPECT_TRUE(RoleHas(v1::ROLE_BOTH, c)) << CapabilityName(c);
    EXPECT_FALSE(RoleHas(v1::ROLE_UNSPECIFIED, c)) << CapabilityName(c);
  }
}

TEST(WorkerRoleTest, AChangeAnnouncesItselfBeforeRefusingWork) {
  FakeClock clock;
  WorkerRoleOptions options;
  options.announce = absl::Seconds(1);
  options.clock_recheck_interval = absl::Milliseconds(1);
  WorkerRole role(v1::ROLE_PREFILL, &clock, options);
  absl::StatusOr<WorkerRole::Started> started =
      role.BeginChange({.role = v1::ROLE_DECODE, .drain_timeout = absl::Seconds(30)});
  ASSERT_THAT(started, IsOk());
  // The pending role shows at once; prefill is still admitted meanwhile.
  EXPECT_EQ(role.state().pending_role, v1::ROLE_DECODE);
  absl::StatusOr<WorkerRole::Work> work = role.Admit(Capability::kPrefill, "late");
  ASSERT_THAT(work, IsOk());
  RoleChangeResult result;
  std::thread finish([&] { result = role.FinishChange(started->change_id); });
  clock.Advance(absl::Seconds(2));
  // The announce is over; the work admitted during it is drained, not
  // aborted.
  work->End();
  finish.join();
  EXPECT_EQ(result.role, v1::ROLE_DECODE);
  EXPECT_EQ(result.drained_sequences, 1);
  EXPECT_EQ(result.aborted_sequences, 0);
  EXPECT_THAT(role.Admit(Capability::kPrefill, "after"),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(WorkerRoleTest, AdmitsOnlyWhatTheRoleServes) {
  FakeClock clock;
  WorkerRole role(v1::ROLE_DECODE, &clock);
  EXPECT_THAT(role.Admit(Capability::kDecode, "r1").status(), IsOk());
  EXPECT_THAT(role.Admit(Capability::kPrefill, "r2").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("ROLE_DECODE, which does not serve prefill")));
  EXPECT_THAT(role.Admit(Capability::kColocated, "r3").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(WorkerRoleTest, CountsWorkUntilItEnds) {
  FakeClock clock;
  WorkerRole role(v1::ROLE_BOTH, &clock);
  auto a = role.Admit(Capability::kPrefill, "a");
  auto b = role.Admit(Capability::kPrefill, "b");
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_THAT(b.status(), IsOk());
  EXPECT_EQ(role.in_flight(Capability::kPrefill), 2);
  WorkerRole::Work moved = *std::move(a);
  EXPECT_FALSE(a->active());
  EXPECT_TRUE(moved.active());
  EXPECT_EQ(role.in_flight(Capability::kPrefill), 2);
  moved.End();
  moved.End();
  EXPECT_EQ(role.in_flight(Capability::kPrefill), 1);
  *b = WorkerRole::Work();
  EXPECT_EQ(role.in_flight(Capability::kPrefill), 0);
}

TEST(WorkerRoleTest, RejectsUnsetRoleAndOutOfRangeDrainTimeoutNamingTheField) {
  FakeClock clock;
  WorkerRole role(v1::ROLE_DECODE, &clock);
  auto unset = role.SetRole(To(v1::ROLE_UNSPECIFIED));
  EXPECT_THAT(unset, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(GetBadRequestField(unset.status()), Optional(Eq("role")));
  for (absl::Duration bad : {absl::Seconds(-1), absl::Hours(1) + absl::Seconds(1)}) {
    auto timeout = role.SetRole(To(v1::ROLE_PREFILL, bad));
    EXPECT_THAT(timeout, StatusIs(absl::StatusCode::kInvalidArgument));
    EXPECT_THAT(GetBadRequestField(timeout.status()), Optional(Eq("drain_timeout")));
  }
  EXPECT_EQ(role.role(), v1::ROLE_DECODE);
}

TEST(WorkerRoleTest, SettingTheCurrentRoleIsANoOpThatKeepsWorkRunning) {
  FakeClock clock;
  WorkerRole role(v1::ROLE_DECODE, &clock);
  FakeCall call(role, Capability::kDecode, "r1");
  auto result = role.SetRole(To(v1::ROLE_DECODE, absl::ZeroDuration()));
  ASSERT_THAT(result.status(), IsOk());
  EXPECT_EQ(result->previous_role, v1::ROLE_DECODE);
  EXPECT_EQ(result->role, v1::ROLE_DECODE);
  EXPECT_EQ(result->drain_time, absl::ZeroDuration());
  EXPECT_EQ(result->aborted_sequences, 0);
  EXPECT_EQ(call.aborts(), 0);
  EXPECT_EQ(role.in_flight(Capability::kDecode), 1);
}

TEST(WorkerRoleTest, SwitchesAtOnceWhenIdleAndCountsTheChange) {
  FakeClock clock;
  prometheus::Registry registry;
  WorkerRoleOptions options;
  options.registry = &registry;
  WorkerRole role(v1::ROLE_DECODE, &clock, options);
  auto result = role.SetRole(To(v1::ROLE_PREFILL));
  ASSERT_THAT(result.status(), IsOk());
  EXPECT_EQ(result->previous_role, v1::ROLE_DECODE);
  EXPECT_EQ(result->role, v1::ROLE_PREFILL);
  EXPECT_EQ(result->drained_sequences, 0);
  EXPECT_EQ(result->aborted_sequences, 0);
  EXPECT_EQ(role.state().role, v1::ROLE_PREFILL);
  EXPECT_EQ(role.state().pending_role, v1::ROLE_UNSPECIFIED);
  EXPECT_THAT(role.Admit(Capability::kPrefill, "p").status(), IsOk());
  EXPECT_THAT(role.Admit(Capability::kDecode, "d").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  double changes = -1;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != "trident_worker_role_changes_total") continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      prometheus::Labels labels;
      for (const auto& l : m.label) labels[l.name] = l.value;
      if (labels == prometheus::Labels{{"from", "decode"}, {"to", "prefill"}}) {
        changes = m.counter.value;
      }
    }
  }
  EXPECT_EQ(changes, 1);
}

// trident_worker_role{role}: prefill, decode, both.
std::array<double, 3> RoleGauges(prometheus::Registry& registry) {
  std::array<double, 3> values{};
  const std::array<std::string, 3> roles = {"prefill", "decode", "both"};
  for (size_t i = 0; i < roles.size(); ++i) {
    const telemetry::CollectedSeries s =
        telemetry::FindSeries(registry, "trident_worker_role", {{"role", roles[i]}});
    EXPECT_TRUE(s.found) << roles[i];
    values[i] = s.value;
  }
  return values;
}

TEST(WorkerRoleTest, RoleGaugeIsOneForTheRoleInEffectAndMovesWhenAChangeSwitches) {
  FakeClock clock;
  prometheus::Registry registry;
  WorkerRoleOptions options = FakeClockOptions();
  options.registry = &registry;
  WorkerRole role(v1::ROLE_DECODE, &clock, options);
  EXPECT_EQ(RoleGauges(registry), (std::array<double, 3>{0, 1, 0}));

  FakeCall call(role, Capability::kDecode, "r1");
  auto started = role.BeginChange(To(v1::ROLE_BOTH));
  ASSERT_THAT(started.status(), IsOk());
  ASSERT_NE(started->change_id, 0u);
  // Draining is not switching: still decode.
  EXPECT_EQ(RoleGauges(registry), (std::array<double, 3>{0, 1, 0}));
  call.End();
  EXPECT_EQ(role.FinishChange(started->change_id).role, v1::ROLE_BOTH);
  EXPECT_EQ(RoleGauges(registry), (std::array<double, 3>{0, 0, 1}));

  ASSERT_THAT(role.SetRole(To(v1::ROLE_PREFILL)).status(), IsOk());
  EXPECT_EQ(RoleGauges(registry), (std::array<double, 3>{1, 0, 0}));
}

TEST(WorkerRoleTest, DrainRefusesNewWorkOfTheLostCapabilityAndWaitsForWorkInFlight) {
  FakeClock clock;
  WorkerRole role(v1::ROLE_DECODE, &clock, FakeClockOptions());
  FakeCall call(role, Capability::kDecode, "r1");
  auto started = role.BeginChange(To(v1::ROLE_PREFILL));
  ASSERT_THAT(started.status(), IsOk());
  ASSERT_NE(started->change_id, 0u);
  EXPECT_EQ(role.state().role, v1::ROLE_DECODE);
  EXPECT_EQ(role.state().pending_role, v1::ROLE_PREFILL);
  EXPECT_THAT(role.Admit(Capability::kDecode, "r2").status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("draining")));
  // Not yet a prefill worker.
  EXPECT_THAT(role.Admit(Capability::kPrefill, "r3").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(role.BeginChange(To(v1::ROLE_BOTH)),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("in progress")));

  RoleChangeResult result;
  std::thread finisher([&] { result = role.FinishChange(started->change_id); });
  clock.Advance(absl::Seconds(2));  // Within the drain timeout.
  call.End();
  finisher.join();
  EXPECT_EQ(result.previous_role, v1::ROLE_DECODE);
  EXPECT_EQ(result.role, v1::ROLE_PREFILL);
  EXPECT_EQ(result.drained_sequences, 1);
  EXPECT_EQ(result.aborted_sequences, 0);
  EXPECT_EQ(call.aborts(), 0);
  EXPECT_EQ(role.state().pending_role, v1::ROLE_UNSPECIFIED);
}

TEST(WorkerRoleTest, DrainTimeoutAbortsOnlyTheLostCapabilitysWork) {
  FakeClock clock;
  WorkerRole role(v1::ROLE_BOTH, &clock, FakeClockOptions());
  FakeCall prefill(role, Capability::kPrefill, "p1");
  FakeCall colocated(role, Capability::kColocated, "g1");
  FakeCall decode(role, Capability::kDecode, "d1");
  auto started = role.BeginChange(To(v1::ROLE_DECODE, absl::Seconds(5)));
  ASSERT_THAT(started.status(), IsOk());
  // Decode work is still admitted: both roles have it.
  auto more_decode = role.Admit(Capability::kDecode, "d2");
  EXPECT_THAT(more_decode.status(), IsOk());

  RoleChangeResult result;
  std::thread finisher([&] { result = role.FinishChange(started->change_id); });
  prefill.End();
  clock.Advance(absl::Seconds(5));
  finisher.join();
  EXPECT_EQ(result.drained_sequences, 1);
  EXPECT_EQ(result.aborted_sequences, 1);
  EXPECT_EQ(result.drain_time, absl::Seconds(5));
  EXPECT_EQ(result.role, v1::ROLE_DECODE);
  EXPECT_EQ(colocated.aborts(), 1);
  EXPECT_THAT(colocated.why(),
              StatusIs(absl::StatusCode::kAborted,
                       HasSubstr("from ROLE_BOTH to ROLE_DECODE and this request did not finish "
                                 "within the drain timeout (5s)")));
  EXPECT_EQ(prefill.aborts(), 0);
  EXPECT_EQ(decode.aborts(), 0);
  EXPECT_EQ(role.in_flight(Capability::kDecode), 2);
  EXPECT_EQ(role.in_flight(Capability::kColocated), 0);
}

TEST(WorkerRoleTest, ZeroDrainTimeoutAbortsAtOnce) {
  FakeClock clock;
  WorkerRole role(v1::ROLE_DECODE, &clock);
  FakeCall a(role, Capability::kDecode, "a");
  FakeCall b(role, Capability::kDecode, "b");
  auto result = role.SetRole(To(v1::ROLE_PREFILL, absl::ZeroDuration()));
  ASSERT_THAT(result.status(), IsOk());
  EXPECT_EQ(result->aborted_sequences, 2);
  EXPECT_EQ(result->drained_sequences, 0);
  EXPECT_EQ(result->drain_time, absl::ZeroDuration());
  EXPECT_EQ(a.aborts(), 1);
  EXPECT_EQ(b.aborts(), 1);
  EXPECT_EQ(role.in_flight(Capability::kDecode), 0);
  EXPECT_EQ(role.role(), v1::ROLE_PREFILL);
}

TEST(WorkerRoleTest, SwitchesAfterTheAbortGraceWhenAbortedWorkLingers) {
  FakeClock clock;
  WorkerRoleOptions options = FakeClockOptions();
  options.abort_grace = absl::Seconds(3);
  WorkerRole role(v1::ROLE_PREFILL, &clock, options);
  FakeCall stuck(role, Capability::kPrefill, "p1", /*end_on_abort=*/false);
  auto started = role.BeginChange(To(v1::ROLE_DECODE, absl::Seconds(1)));
  ASSERT_THAT(started.status(), IsOk());
  RoleChangeResult result;
  std::thread finisher([&] { result = role.FinishChange(started->change_id); });
  clock.Advance(absl::Seconds(1));
  stuck.aborted().WaitForNotification();
  clock.Advance(absl::Seconds(3));
  finisher.join();
  EXPECT_EQ(result.aborted_sequences, 1);
  EXPECT_EQ(result.drain_time, absl::Seconds(4));
  EXPECT_EQ(role.role(), v1::ROLE_DECODE);
  EXPECT_EQ(role.in_flight(Capability::kPrefill), 1);  // Ends when it ends.
  stuck.End();
}

TEST(WorkerRoleTest, CutDrainShortAbortsWithoutWaitingForTheTimeout) {
  FakeClock clock;
  WorkerRole role(v1::ROLE_DECODE, &clock);  // No clock re-reads: only the cut wakes it.
  FakeCall call(role, Capability::kDecode, "d1");
  auto started = role.BeginChange(To(v1::ROLE_PREFILL, absl::Hours(1)));
  ASSERT_THAT(started.status(), IsOk());
  role.CutDrainShort(started->change_id + 1);  // Another change: ignored.
  RoleChangeResult result;
  std::thread finisher([&] { result = role.FinishChange(started->change_id); });
  role.CutDrainShort(started->change_id);
  finisher.join();
  EXPECT_EQ(result.aborted_sequences, 1);
  EXPECT_EQ(call.aborts(), 1);
  EXPECT_EQ(role.role(), v1::ROLE_PREFILL);
}

TEST(WorkerRoleTest, RefusesDirectivesOlderThanTheLastApplied) {
  FakeClock clock;
  WorkerRole role(v1::ROLE_DECODE, &clock);
  ASSERT_THAT(role.SetRole(To(v1::ROLE_PREFILL, absl::ZeroDuration(), 7)).status(), IsOk());
  EXPECT_THAT(role.SetRole(To(v1::ROLE_DECODE, absl::ZeroDuration(), 6)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("directive 6 is stale")));
  EXPECT_EQ(role.role(), v1::ROLE_PREFILL);
  // Unnumbered directives always apply; numbered ones keep counting.
  ASSERT_THAT(role.SetRole(To(v1::ROLE_DECODE, absl::ZeroDuration(), 0)).status(), IsOk());
  EXPECT_THAT(role.SetRole(To(v1::ROLE_BOTH, absl::ZeroDuration(), 3)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(role.SetRole(To(v1::ROLE_BOTH, absl::ZeroDuration(), 8)).status(), IsOk());
  EXPECT_EQ(role.role(), v1::ROLE_BOTH);
  // A no-op counts as applied too.
  ASSERT_THAT(role.SetRole(To(v1::ROLE_BOTH, absl::ZeroDuration(), 9)).status(), IsOk());
  EXPECT_THAT(role.SetRole(To(v1::ROLE_DECODE, absl::ZeroDuration(), 8)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(WorkerRoleTest, WithoutKvTransportOnlyRoleBothCanBeSet) {
  FakeClock clock;
  WorkerRoleOptions options;
  options.has_kv_transport = false;
  WorkerRole role(v1::ROLE_BOTH, &clock, options);
  EXPECT_THAT(role.SetRole(To(v1::ROLE_PREFILL)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("--kv_transport=ucx")));
  EXPECT_THAT(role.SetRole(To(v1::ROLE_BOTH)).status(), IsOk());
  EXPECT_EQ(role.role(), v1::ROLE_BOTH);
}

TEST(WorkerRoleTest, WorkOutlivingItsRoleEndsHarmlessly) {
  FakeClock clock;
  WorkerRole::Work survivor;
  {
    WorkerRole role(v1::ROLE_BOTH, &clock);
    auto work = role.Admit(Capability::kColocated, "g1");
    ASSERT_THAT(work.status(), IsOk());
    survivor = *std::move(work);
  }
  EXPECT_TRUE(survivor.active());
  survivor.SetAbortHook(nullptr);
  survivor.End();
  EXPECT_FALSE(survivor.active());
}

}  // namespace
}  // namespace trident::worker
