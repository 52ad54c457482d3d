#include "common/controller_client/member_requests.h"

#include "gtest/gtest.h"

namespace trident::controller_client {
namespace {

namespace v1 = ::trident::v1;

v1::RegisterRequest Worker(const std::string& id, uint64_t incarnation) {
  v1::RegisterRequest request;
  v1::WorkerRegistration* w = request.mutable_worker();
  w->set_worker_id(id);
  w->set_incarnation(incarnation);
  w->set_address("127.0.0.1:1");
  w->set_role(v1::ROLE_DECODE);
  return request;
}

TEST(MemberRequestsTest, RegistrationsNeedAnIdAnIncarnationAnAddressAndAWorkersRole) {
  EXPECT_TRUE(ValidateRegisterRequest(Worker("w1", 1)).ok());
  EXPECT_EQ(ValidateRegisterRequest(v1::RegisterRequest()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateRegisterRequest(Worker("", 1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateRegisterRequest(Worker("w 1", 1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateRegisterRequest(Worker(std::string(129, 'w'), 1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateRegisterRequest(Worker("w1", 0)).code(), absl::StatusCode::kInvalidArgument);
  v1::RegisterRequest no_role = Worker("w1", 1);
  no_role.mutable_worker()->set_role(v1::ROLE_UNSPECIFIED);
  const absl::Status status = ValidateRegisterRequest(no_role);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("worker.role"), absl::string_view::npos) << status;
  v1::RegisterRequest attention;
  attention.mutable_attention()->set_service_id("a1");
  attention.mutable_attention()->set_incarnation(3);
  EXPECT_EQ(ValidateRegisterRequest(attention).code(), absl::StatusCode::kInvalidArgument);
  attention.mutable_attention()->set_address("127.0.0.1:2");
  EXPECT_TRUE(ValidateRegisterRequest(attention).ok());
}

TEST(MemberRequestsTest, HeartbeatsAreServingOrDrainingWithTheirOwnKindOfLoad) {
  EXPECT_TRUE(ValidateHeartbeatState(v1::SERVING_STATE_SERVING).ok());
  EXPECT_TRUE(ValidateHeartbeatState(v1::SERVING_STATE_DRAINING).ok());
  EXPECT_EQ(ValidateHeartbeatState(v1::SERVING_STATE_UNSPECIFIED).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateHeartbeatState(v1::SERVING_STATE_DEAD).code(),
            absl::StatusCode::kInvalidArgument);
  v1::HeartbeatRequest worker_load;
  worker_load.mutable_worker_load();
  v1::HeartbeatRequest attention_load;
  attention_load.mutable_attention_load();
  EXPECT_TRUE(ValidateHeartbeatLoad(worker_load, /*from_worker=*/true).ok());
  EXPECT_TRUE(ValidateHeartbeatLoad(attention_load, /*from_worker=*/false).ok());
  EXPECT_TRUE(ValidateHeartbeatLoad(v1::HeartbeatRequest(), /*from_worker=*/true).ok());
  EXPECT_EQ(ValidateHeartbeatLoad(attention_load, true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateHeartbeatLoad(worker_load, false).code(), absl::StatusCode::kInvalidArgument);
}

TEST(MemberRequestsTest, AnUnknownMemberRegistersAgainAndAnotherIncarnationIsRefused) {
  EXPECT_TRUE(CheckMemberIncarnation("w1", true, 5, 5, 9).ok());
  const absl::Status unknown = CheckMemberIncarnation("w1", false, 0, 5, 9);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.message().find("register again"), absl::string_view::npos) << unknown;
  EXPECT_EQ(CheckMemberIncarnation("w1", true, 5, 4, 9).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckMemberIncarnation("w1", true, 5, 6, 9).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace trident::controller_client
