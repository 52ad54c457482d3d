#include "common/status/error_details.h"

#include <cstdint>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/time/proto_time.h"
#include "google/rpc/error_details.pb.h"

namespace trident {
namespace {

constexpr absl::string_view kTypeUrlPrefix = "type.googleapis.com/";

template <typename Message>
std::string TypeUrl() {
  return absl::StrCat(kTypeUrlPrefix, Message::descriptor()->full_name());
}

template <typename Message>
std::optional<Message> GetDetail(const absl::Status& status) {
  auto payload = status.GetPayload(TypeUrl<Message>());
  if (!payload.has_value()) return std::nullopt;
  Message message;
  if (!message.ParseFromString(std::string(*payload))) return std::nullopt;
  return message;
}

}  // namespace

absl::Status ResourceExhaustedWithRetry(absl::string_view message, absl::Duration retry_delay) {
  absl::Status status = absl::ResourceExhaustedError(message);
  google::rpc::RetryInfo info;
  SetProtoDuration(retry_delay, info.mutable_retry_delay());
  status.SetPayload(TypeUrl<google::rpc::RetryInfo>(), absl::Cord(info.SerializeAsString()));
  return status;
}

std::optional<absl::Duration> GetRetryDelay(const absl::Status& status) {
  std::optional<google::rpc::RetryInfo> info = GetDetail<google::rpc::RetryInfo>(status);
  if (!info.has_value()) return std::nullopt;
  return DurationFromProto(info->retry_delay());
}

absl::Status InvalidArgumentForField(absl::string_view field, absl::string_view description) {
  absl::Status status = absl::InvalidArgumentError(absl::StrCat(field, ": ", description));
  google::rpc::BadRequest bad_request;
  google::rpc::BadRequest::FieldViolation* violation = bad_request.add_field_violations();
  violation->set_field(std::string(field));
  violation->set_description(std::string(description));
  status.SetPayload(TypeUrl<google::rpc::BadRequest>(),
                    absl::Cord(bad_request.SerializeAsString()));
  return status;
}

std::optional<std::string> GetBadRequestField(const absl::Status& status) {
  std::optional<google::rpc::BadRequest> bad_request = GetDetail<google::rpc::BadRequest>(status);
  if (!bad_request.has_value() || bad_request->field_violations().empty()) return std::nullopt;
  return bad_request->field_violations(0).field();
}

}  // namespace trident
