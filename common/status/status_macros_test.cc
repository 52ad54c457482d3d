#include "common/status/status_macros.h"

#include <memory>
#include <string>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::IsOkAndHolds;
using ::trident::testing::StatusIs;

absl::StatusOr<int> ParsePositive(int value) {
  if (value <= 0) return absl::InvalidArgumentError("value must be positive");
  return value;
}

absl::StatusOr<std::unique_ptr<int>> MakeBox(int value) { return std::make_unique<int>(value); }

absl::StatusOr<int> Double(int value) {
  TRIDENT_ASSIGN_OR_RETURN(const int parsed, ParsePositive(value));
  return parsed * 2;
}

absl::StatusOr<int> Unbox(int value) {
  // Move-only values are moved out of the StatusOr.
  TRIDENT_ASSIGN_OR_RETURN(std::unique_ptr<int> box, MakeBox(value));
  return *box;
}

int calls = 0;
absl::Status CountedCheck(int value) {
  ++calls;
  return ParsePositive(value).status();
}

absl::Status CheckBoth(int a, int b) {
  TRIDENT_RETURN_IF_ERROR(CountedCheck(a));
  TRIDENT_RETURN_IF_ERROR(CountedCheck(b));
  return absl::OkStatus();
}

TEST(StatusMacrosTest, AssignOrReturnPassesValueThrough) {
  EXPECT_THAT(Double(21), IsOkAndHolds(42));
  EXPECT_THAT(Unbox(7), IsOkAndHolds(7));
}

TEST(StatusMacrosTest, AssignOrReturnReturnsTheError) {
  EXPECT_THAT(Double(-1), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("positive")));
}

TEST(StatusMacrosTest, ReturnIfErrorStopsAtFirstErrorAndEvaluatesOnce) {
  calls = 0;
  EXPECT_THAT(CheckBoth(1, 2), IsOk());
  EXPECT_EQ(calls, 2);
  calls = 0;
  EXPECT_THAT(CheckBoth(-1, 2), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(calls, 1);
}

TEST(StatusMatchersTest, DescribeMismatches) {
  EXPECT_THAT(absl::NotFoundError("x"), ::testing::Not(IsOk()));
  EXPECT_THAT(absl::NotFoundError("x"),
              ::testing::Not(StatusIs(absl::StatusCode::kInvalidArgument)));
  EXPECT_THAT(absl::StatusOr<int>(3), ::testing::Not(IsOkAndHolds(4)));
  EXPECT_THAT(absl::StatusOr<int>(absl::UnavailableError("down")),
              ::testing::Not(IsOkAndHolds(4)));
}

}  // namespace
}  // namespace trident
