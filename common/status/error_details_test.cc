#include "common/status/error_details.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident {
namespace {

using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::Optional;
using ::trident::testing::StatusIs;

TEST(ErrorDetailsTest, ResourceExhaustedCarriesRetryDelay) {
  const absl::Status status =
      ResourceExhaustedWithRetry("no decode worker meets the TPOT SLO", absl::Milliseconds(1250));
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("TPOT")));
  EXPECT_THAT(GetRetryDelay(status), Optional(Eq(absl::Milliseconds(1250))));
}

TEST(ErrorDetailsTest, PlainStatusHasNoDetails) {
  EXPECT_EQ(GetRetryDelay(absl::ResourceExhaustedError("full")), std::nullopt);
  EXPECT_EQ(GetBadRequestField(absl::InvalidArgumentError("bad")), std::nullopt);
}

TEST(ErrorDetailsTest, InvalidArgumentNamesTheField) {
  const absl::Status status = InvalidArgumentForField("sampling.top_p", "must be in (0, 1]");
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument,
                               Eq("sampling.top_p: must be in (0, 1]")));
  EXPECT_THAT(GetBadRequestField(status), Optional(Eq("sampling.top_p")));
}

}  // namespace
}  // namespace trident
