#include "common/process/subprocess.h"

#include <signal.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

std::string TmpPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
}

TEST(SubprocessTest, ReadsTheReadyLineThatTheChildWrites) {
  // The shell writes to the descriptor named by the appended --ready_fd=N.
  auto spawned = Spawn({.argv = {"/bin/sh", "-c",
                                 "fd=${0#--ready_fd=}; echo '{\"port\":7}' >&$fd; exit 3"},
                        .wait_for_ready_line = true});
  ASSERT_THAT(spawned, IsOk());
  EXPECT_EQ(spawned->ready_line, "{\"port\":7}");
  auto exit = WaitForExit(spawned->pid, absl::Seconds(30));
  ASSERT_THAT(exit, IsOk());
  EXPECT_EQ(exit->exit_code, 3);
  EXPECT_EQ(exit->signal, 0);
}

TEST(SubprocessTest, ReportsAChildThatExitsBeforeReadyWithItsLog) {
  const std::string log = TmpPath("early_exit.log");
  EXPECT_THAT(Spawn({.argv = {"/bin/sh", "-c", "echo cannot load model >&2; exit 2"},
                     .log_path = log,
                     .wait_for_ready_line = true}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::AllOf(HasSubstr("exited with code 2"),
                                        HasSubstr("cannot load model"))));
}

TEST(SubprocessTest, KillsAChildThatNeverReportsReady) {
  EXPECT_THAT(Spawn({.argv = {"/bin/sh", "-c", "exec sleep 600"},
                     .wait_for_ready_line = true,
                     .ready_timeout = absl::Milliseconds(100)}),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("did not report ready")));
}

TEST(SubprocessTest, RejectsAMissingProgram) {
  EXPECT_THAT(Spawn({.argv = {"/nonexistent/trident"}}), StatusIs(absl::StatusCode::kNotFound));
}

TEST(SubprocessTest, WaitTimesOutThenSeesTheSignal) {
  auto spawned = Spawn({.argv = {"/bin/sh", "-c", "exec sleep 600"}});
  ASSERT_THAT(spawned, IsOk());
  EXPECT_TRUE(IsRunning(spawned->pid));
  EXPECT_THAT(WaitForExit(spawned->pid, absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  kill(spawned->pid, SIGTERM);
  auto exit = WaitForExit(spawned->pid, absl::Seconds(30));
  ASSERT_THAT(exit, IsOk());
  EXPECT_EQ(exit->signal, SIGTERM);
  EXPECT_FALSE(IsRunning(spawned->pid));
}

}  // namespace
}  // namespace trident
