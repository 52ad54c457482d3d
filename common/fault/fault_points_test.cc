#include "common/fault/fault_points.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::fault {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

TEST(FaultPointsTest, UnarmedPointsPass) {
  ASSERT_THAT(ArmFaultPoints(""), IsOk());
  EXPECT_THAT(FaultPoint("a.b"), IsOk());
  EXPECT_EQ(FaultPointActions("a.b"), 0);
}

TEST(FaultPointsTest, AFailPointFailsAfterItsSkips) {
  ASSERT_THAT(ArmFaultPoints("x.fail=fail@2, other=fail"), IsOk());
  EXPECT_THAT(FaultPoint("x.fail"), IsOk());
  EXPECT_THAT(FaultPoint("x.fail"), IsOk());
  EXPECT_THAT(FaultPoint("x.fail"),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("fault point x.fail")));
  EXPECT_THAT(FaultPoint("x.fail"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(FaultPoint("not.armed"), IsOk());
  EXPECT_EQ(FaultPointActions("x.fail"), 2);
  ASSERT_THAT(ArmFaultPoints(""), IsOk());
  EXPECT_THAT(FaultPoint("x.fail"), IsOk());
}

TEST(FaultPointsTest, ACrashPointKillsTheProcessWithSigkill) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (!ArmFaultPoints("boom=crash@1").ok()) _exit(2);
    (void)FaultPoint("boom");  // passes
    (void)FaultPoint("boom");  // dies
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
}

TEST(FaultPointsTest, APointWaitingForSigusr2PassesUntilItComes) {
  ASSERT_THAT(ArmFaultPoints("later=fail@1~"), IsOk());
  EXPECT_THAT(FaultPoint("later"), IsOk());
  EXPECT_THAT(FaultPoint("later"), IsOk());
  ASSERT_EQ(raise(SIGUSR2), 0);
  EXPECT_THAT(FaultPoint("later"), IsOk());  // its one skip
  EXPECT_THAT(FaultPoint("later"), StatusIs(absl::StatusCode::kUnavailable));
  ASSERT_THAT(ArmFaultPoints(""), IsOk());
}

TEST(FaultPointsTest, MalformedSpecsAreRefusedNamingTheEntry) {
  EXPECT_THAT(ArmFaultPoints("a=explode"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("\"a=explode\"")));
  EXPECT_THAT(ArmFaultPoints("=crash"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ArmFaultPoints("a=crash@x"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ArmFaultPoints("a=crash@-1"), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace trident::fault
