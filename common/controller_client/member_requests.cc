#include "common/controller_client/member_requests.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status/error_details.h"

namespace trident::controller_client {
namespace {

namespace v1 = ::trident::v1;

constexpr size_t kMaxIdBytes = 128;

absl::Status ValidateId(absl::string_view field, absl::string_view id) {
  if (id.empty()) return InvalidArgumentForField(field, "must not be empty");
  if (id.size() > kMaxIdBytes) {
    return InvalidArgumentForField(field,
                                   absl::StrCat("is ", id.size(), " bytes; at most ", kMaxIdBytes));
  }
  for (char c : id) {
    if (c < 0x21 || c > 0x7e) {
      return InvalidArgumentForField(field, "must be printable ASCII without spaces");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateCommon(absl::string_view prefix, absl::string_view id_field,
                            absl::string_view id, uint64_t incarnation, absl::string_view address) {
  if (absl::Status s = ValidateId(absl::StrCat(prefix, ".", id_field), id); !s.ok()) return s;
  if (incarnation == 0) {
    return InvalidArgumentForField(absl::StrCat(prefix, ".incarnation"), "must be nonzero");
  }
  if (address.empty()) {
    return InvalidArgumentForField(absl::StrCat(prefix, ".address"),
                                   "must name the member's gRPC host:port");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateRegisterRequest(const v1::RegisterRequest& request) {
  switch (request.member_case()) {
    case v1::RegisterRequest::kWorker: {
      const v1::WorkerRegistration& w = request.worker();
      if (absl::Status s =
              ValidateCommon("worker", "worker_id", w.worker_id(), w.incarnation(), w.address());
          !s.ok()) {
        return s;
      }
      if (w.role() == v1::ROLE_UNSPECIFIED) {
        return InvalidArgumentForField("worker.role", "name the role the worker starts in");
      }
      return absl::OkStatus();
    }
    case v1::RegisterRequest::kAttention: {
      const v1::AttentionRegistration& a = request.attention();
      return ValidateCommon("attention", "service_id", a.service_id(), a.incarnation(),
                            a.address());
    }
    default:
      return InvalidArgumentForField("member", "set exactly one of worker or attention");
  }
}

absl::Status ValidateHeartbeatState(v1::ServingState state) {
  if (state != v1::SERVING_STATE_SERVING && state != v1::SERVING_STATE_DRAINING) {
    return InvalidArgumentForField("state", "must be SERVING or DRAINING");
  }
  return absl::OkStatus();
}

absl::Status ValidateHeartbeatLoad(const v1::HeartbeatRequest& request, bool from_worker) {
  if (from_worker && request.load_case() == v1::HeartbeatRequest::kAttentionLoad) {
    return InvalidArgumentForField("attention_load", "a worker reports worker_load");
  }
  if (!from_worker && request.load_case() == v1::HeartbeatRequest::kWorkerLoad) {
    return InvalidArgumentForField("worker_load", "an attention service reports attention_load");
  }
  return absl::OkStatus();
}

absl::Status CheckMemberIncarnation(const std::string& member_id, bool registered,
                                    uint64_t registered_incarnation, uint64_t incarnation,
                                    uint64_t controller_incarnation) {
  if (!registered) {
    return absl::NotFoundError(absl::StrCat("member '", member_id,
                                            "' is not registered with controller incarnation ",
                                            controller_incarnation, "; register again"));
  }
  if (registered_incarnation != incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("member '", member_id, "' is registered as incarnation ",
                     registered_incarnation, ", not ", incarnation));
  }
  return absl::OkStatus();
}

}  // namespace trident::controller_client
