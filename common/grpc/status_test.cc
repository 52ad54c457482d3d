#include "common/grpc/status.h"

#include "common/status/error_details.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident {
namespace {

using ::testing::Eq;
using ::testing::Optional;
using ::trident::testing::StatusIs;

TEST(GrpcStatusTest, OkStaysOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
}

TEST(GrpcStatusTest, EveryCodeCarriesOverUnchanged) {
  for (int code = 1; code <= 16; ++code) {
    const absl::Status status(static_cast<absl::StatusCode>(code), "message");
    const grpc::Status wire = ToGrpcStatus(status);
    EXPECT_EQ(static_cast<int>(wire.error_code()), code);
    EXPECT_EQ(wire.error_message(), "message");
    EXPECT_EQ(wire.error_details(), "");
    EXPECT_THAT(FromGrpcStatus(wire),
                StatusIs(static_cast<absl::StatusCode>(code), Eq("message")));
  }
}

TEST(GrpcStatusTest, RetryInfoSurvivesTheRoundTrip) {
  const grpc::Status wire =
      ToGrpcStatus(ResourceExhaustedWithRetry("queue full", absl::Milliseconds(300)));
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_FALSE(wire.error_details().empty());

  const absl::Status back = FromGrpcStatus(wire);
  EXPECT_THAT(back, StatusIs(absl::StatusCode::kResourceExhausted, Eq("queue full")));
  EXPECT_THAT(GetRetryDelay(back), Optional(Eq(absl::Milliseconds(300))));
}

TEST(GrpcStatusTest, BadRequestFieldSurvivesTheRoundTrip) {
  const absl::Status back =
      FromGrpcStatus(ToGrpcStatus(InvalidArgumentForField("sampling.top_k", "must be >= 0")));
  EXPECT_THAT(back, StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(GetBadRequestField(back), Optional(Eq("sampling.top_k")));
}

TEST(GrpcStatusTest, AContextPrefixesTheMessageAndKeepsCodeAndDetails) {
  const absl::Status back = FromGrpcStatus(
      ToGrpcStatus(ResourceExhaustedWithRetry("queue full", absl::Milliseconds(300))),
      "CommitKv to d1 at 10.0.0.7:50052");
  EXPECT_THAT(back, StatusIs(absl::StatusCode::kResourceExhausted,
                             Eq("CommitKv to d1 at 10.0.0.7:50052: queue full")));
  EXPECT_THAT(GetRetryDelay(back), Optional(Eq(absl::Milliseconds(300))));
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "anything").ok());
}

TEST(GrpcStatusTest, GarbageDetailsAreIgnored) {
  const absl::Status back = FromGrpcStatus(
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining", "\xff\xff not a proto"));
  EXPECT_THAT(back, StatusIs(absl::StatusCode::kUnavailable, Eq("draining")));
  EXPECT_EQ(GetRetryDelay(back), std::nullopt);
}

}  // namespace
}  // namespace trident
