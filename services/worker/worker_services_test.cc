#include "services/worker/worker_services.h"

#include "common/status/error_details.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::worker {
namespace {

using ::testing::Eq;
using ::testing::Optional;
using ::trident::testing::IsOkAndHolds;
using ::trident::testing::StatusIs;

TEST(ParseDeviceTest, AcceptsCpuAndCudaOrdinals) {
  auto cpu = ParseDevice("cpu");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->kind, Device::Kind::kCpu);
  auto cuda = ParseDevice("CUDA:3");
  ASSERT_TRUE(cuda.ok());
  EXPECT_EQ(cuda->kind, Device::Kind::kCuda);
  EXPECT_EQ(cuda->ordinal, 3);
  EXPECT_EQ(cuda->ToString(), "cuda:3");
}

TEST(ParseDeviceTest, RejectsMalformedDevicesNamingTheFlag) {
  for (const char* bad : {"", "gpu", "cuda", "cuda:", "cuda:-1", "cuda:x", "cpu:0"}) {
    const auto device = ParseDevice(bad);
    EXPECT_THAT(device, StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
    EXPECT_THAT(GetBadRequestField(device.status()), Optional(Eq("--device"))) << bad;
  }
}

TEST(ParseRoleTest, AcceptsTheThreeRoles) {
  EXPECT_THAT(ParseRole("prefill"), IsOkAndHolds(trident::v1::ROLE_PREFILL));
  EXPECT_THAT(ParseRole("Decode"), IsOkAndHolds(trident::v1::ROLE_DECODE));
  EXPECT_THAT(ParseRole("both"), IsOkAndHolds(trident::v1::ROLE_BOTH));
  EXPECT_THAT(ParseRole("colocated"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(RoleChangeFromProtoTest, DefaultsTheDrainTimeoutAndRefusesMalformedDurations) {
  trident::v1::SetRoleRequest request;
  request.set_role(trident::v1::ROLE_DECODE);
  request.set_directive_id(9);
  request.set_reason("rebalance");
  auto change = RoleChangeFromProto(request);
  ASSERT_TRUE(change.ok());
  EXPECT_EQ(change->role, trident::v1::ROLE_DECODE);
  EXPECT_EQ(change->drain_timeout, absl::Seconds(30));
  EXPECT_EQ(change->directive_id, 9u);
  EXPECT_EQ(change->reason, "rebalance");
  request.mutable_drain_timeout();  // Set, zero: abort at once.
  EXPECT_THAT(RoleChangeFromProto(request),
              IsOkAndHolds(::testing::Field(&RoleChange::drain_timeout, absl::ZeroDuration())));
  request.mutable_drain_timeout()->set_seconds(1);
  request.mutable_drain_timeout()->set_nanos(-5);
  const auto bad = RoleChangeFromProto(request);
  EXPECT_THAT(bad, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(GetBadRequestField(bad.status()), Optional(Eq("drain_timeout")));
}

TEST(WorkerLoadFromStatsTest, ReportsDrainingAndThePendingRole) {
  WorkerIdentity identity{.worker_id = "w", .incarnation = 3, .role = trident::v1::ROLE_BOTH};
  const engine::EngineStats stats;
  EXPECT_EQ(WorkerLoadFromStats(identity, stats, 0, 0, absl::UnixEpoch()).state(),
            trident::v1::SERVING_STATE_SERVING);
  identity.pending_role = trident::v1::ROLE_DECODE;
  const trident::v1::WorkerLoad load =
      WorkerLoadFromStats(identity, stats, 0, 0, absl::UnixEpoch());
  EXPECT_EQ(load.state(), trident::v1::SERVING_STATE_DRAINING);
  EXPECT_EQ(load.role(), trident::v1::ROLE_BOTH);
  EXPECT_EQ(load.pending_role(), trident::v1::ROLE_DECODE);
}

}  // namespace
}  // namespace trident::worker
