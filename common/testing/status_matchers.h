#ifndef TRIDENT_COMMON_TESTING_STATUS_MATCHERS_H_
#define TRIDENT_COMMON_TESTING_STATUS_MATCHERS_H_

// gMock matchers for absl::Status and absl::StatusOr<T>, with the meaning of
// Abseil's later `absl_testing::StatusIs` / `IsOk` / `IsOkAndHolds`:
//
//   EXPECT_THAT(Load(path), StatusIs(absl::StatusCode::kInvalidArgument,
//                                    HasSubstr("config.json")));
//   EXPECT_THAT(Parse("7"), IsOkAndHolds(7));
//   ASSERT_THAT(server.Start(), IsOk());

#include <ostream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace trident::testing {
namespace internal {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }

template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace internal

// Matches a Status or StatusOr whose code matches `code_matcher` and whose
// message matches `message_matcher` (anything, if omitted).
MATCHER_P2(StatusIs, code_matcher, message_matcher,
           "status whose code " +
               ::testing::DescribeMatcher<absl::StatusCode>(code_matcher, negation) +
               " and whose message " +
               ::testing::DescribeMatcher<std::string>(message_matcher, negation)) {
  const absl::Status& status = internal::GetStatus(arg);
  *result_listener << "whose status is " << status;
  return ::testing::ExplainMatchResult(code_matcher, status.code(), result_listener) &&
         ::testing::ExplainMatchResult(message_matcher, std::string(status.message()),
                                       result_listener);
}

MATCHER_P(StatusIs, code_matcher,
          "status whose code " +
              ::testing::DescribeMatcher<absl::StatusCode>(code_matcher, negation)) {
  const absl::Status& status = internal::GetStatus(arg);
  *result_listener << "whose status is " << status;
  return ::testing::ExplainMatchResult(code_matcher, status.code(), result_listener);
}

// Matches an OK Status or StatusOr.
MATCHER(IsOk, negation ? "is not OK" : "is OK") {
  const absl::Status& status = internal::GetStatus(arg);
  *result_listener << "whose status is " << status;
  return status.ok();
}

// Matches an OK StatusOr whose value matches `value_matcher`.
MATCHER_P(IsOkAndHolds, value_matcher,
          negation ? "is not OK or holds a value that does not match"
                   : "is OK and holds a value that matches") {
  if (!arg.ok()) {
    *result_listener << "whose status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

}  // namespace trident::testing

#endif  // TRIDENT_COMMON_TESTING_STATUS_MATCHERS_H_
