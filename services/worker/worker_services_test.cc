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

}  // namespace
}  // namespace trident::worker
