#include "common/logging/log.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace trident::log {
namespace {

TEST(LogTest, ParsesSeverityNames) {
  Severity severity = Severity::kFatal;
  EXPECT_TRUE(ParseSeverity("WARNING", &severity));
  EXPECT_EQ(severity, Severity::kWarning);
  EXPECT_TRUE(ParseSeverity("debug", &severity));
  EXPECT_EQ(severity, Severity::kDebug);
  EXPECT_FALSE(ParseSeverity("loud", &severity));
}

TEST(LogTest, WritesOneLineWithSeverityLetterAndLocation) {
  ::testing::internal::CaptureStderr();
  TRIDENT_LOG(WARNING) << "disk at " << 93 << "%";
  const std::string out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out[0], 'W');
  EXPECT_NE(out.find("log_test.cc:"), std::string::npos);
  EXPECT_NE(out.find("] disk at 93%\n"), std::string::npos);
}

TEST(LogTest, DropsLinesBelowMinimumSeverityWithoutEvaluatingThem) {
  SetMinSeverity(Severity::kError);
  int evaluated = 0;
  ::testing::internal::CaptureStderr();
  TRIDENT_LOG(INFO) << "hidden " << ++evaluated;
  const std::string out = ::testing::internal::GetCapturedStderr();
  SetMinSeverity(Severity::kInfo);
  EXPECT_EQ(out, "");
  EXPECT_EQ(evaluated, 0);
}

TEST(LogDeathTest, CheckFailureAbortsWithTheCondition) {
  const int blocks = 3;
  EXPECT_DEATH(TRIDENT_CHECK(blocks > 4) << "need more", "Check failed: blocks > 4 need more");
  EXPECT_DEATH(TRIDENT_CHECK_OK(absl::InternalError("broken")), "broken");
}

}  // namespace
}  // namespace trident::log
