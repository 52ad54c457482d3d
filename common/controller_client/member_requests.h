#ifndef TRIDENT_COMMON_CONTROLLER_CLIENT_MEMBER_REQUESTS_H_
#define TRIDENT_COMMON_CONTROLLER_CLIENT_MEMBER_REQUESTS_H_

// The rules of trident.v1.Controller's member requests (controller.proto),
// in one place for the controller's membership and for the in-memory
// controller its clients are tested against, so that both answer a request
// with the same status.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "trident/v1/controller.pb.h"

namespace trident::controller_client {

// INVALID_ARGUMENT, naming the field, for a registration the controller
// refuses: not exactly one of worker or attention, an empty, over-long or
// non-printable id, a zero incarnation, no address, a worker without a
// role.
absl::Status ValidateRegisterRequest(const trident::v1::RegisterRequest& request);

// INVALID_ARGUMENT for a heartbeat whose state is neither SERVING nor
// DRAINING.
absl::Status ValidateHeartbeatState(trident::v1::ServingState state);

// INVALID_ARGUMENT for a heartbeat carrying the other kind of member's load
// (a worker reports worker_load, an attention service attention_load).
absl::Status ValidateHeartbeatLoad(const trident::v1::HeartbeatRequest& request, bool from_worker);

// A heartbeat's or deregistration's `incarnation` of `member_id` against
// what the controller holds: NOT_FOUND when it holds no such member ("register
// again", naming `controller_incarnation`), FAILED_PRECONDITION when it
// holds another incarnation (older or newer), else OK.
absl::Status CheckMemberIncarnation(const std::string& member_id, bool registered,
                                    uint64_t registered_incarnation, uint64_t incarnation,
                                    uint64_t controller_incarnation);

}  // namespace trident::controller_client

#endif  // TRIDENT_COMMON_CONTROLLER_CLIENT_MEMBER_REQUESTS_H_
