#include "common/grpc/status.h"

#include "absl/strings/str_cat.h"

#include <string>

#include "absl/strings/cord.h"
#include "google/rpc/status.pb.h"

namespace trident {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  google::rpc::Status details;
  status.ForEachPayload([&details](absl::string_view type_url, const absl::Cord& payload) {
    google::protobuf::Any* any = details.add_details();
    any->set_type_url(std::string(type_url));
    any->set_value(std::string(payload));
  });
  const std::string message(status.message());
  if (details.details().empty()) {
    return grpc::Status(static_cast<grpc::StatusCode>(status.code()), message);
  }
  details.set_code(static_cast<int>(status.code()));
  details.set_message(message);
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), message,
                      details.SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status result(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
  google::rpc::Status details;
  if (!status.error_details().empty() && details.ParseFromString(status.error_details())) {
    for (const google::protobuf::Any& any : details.details()) {
      result.SetPayload(any.type_url(), absl::Cord(any.value()));
    }
  }
  return result;
}

absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context) {
  const absl::Status from = FromGrpcStatus(status);
  if (from.ok()) return from;
  absl::Status out(from.code(), absl::StrCat(context, ": ", from.message()));
  from.ForEachPayload([&out](absl::string_view type_url, const absl::Cord& payload) {
    out.SetPayload(type_url, payload);
  });
  return out;
}

}  // namespace trident
