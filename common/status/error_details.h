#ifndef TRIDENT_COMMON_STATUS_ERROR_DETAILS_H_
#define TRIDENT_COMMON_STATUS_ERROR_DETAILS_H_

// Typed error details (google.rpc.RetryInfo, google.rpc.BadRequest) carried
// as absl::Status payloads. The payload's type URL is the detail's
// `type.googleapis.com/<full name>` and its value the serialized message, so
// `ToGrpcStatus` (common/grpc/status.h) can put them into the standard
// `grpc-status-details-bin` trailer unchanged, where any gRPC client reads
// them.

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trident {

// RESOURCE_EXHAUSTED with a RetryInfo detail asking the client to wait at
// least `retry_delay` before retrying. This is how every overload is reported.
absl::Status ResourceExhaustedWithRetry(absl::string_view message, absl::Duration retry_delay);

// The RetryInfo delay carried by `status`, if any.
std::optional<absl::Duration> GetRetryDelay(const absl::Status& status);

// INVALID_ARGUMENT whose message names `field` ("<field>: <description>") and
// which carries a BadRequest detail with that field violation.
absl::Status InvalidArgumentForField(absl::string_view field, absl::string_view description);

// The first BadRequest field violation's field name carried by `status`, if any.
std::optional<std::string> GetBadRequestField(const absl::Status& status);

}  // namespace trident

#endif  // TRIDENT_COMMON_STATUS_ERROR_DETAILS_H_
