#ifndef TRIDENT_COMMON_GRPC_HEALTH_CLIENT_H_
#define TRIDENT_COMMON_GRPC_HEALTH_CLIENT_H_

// A client of the standard `grpc.health.v1.Health` service, as Kubernetes'
// gRPC probes and load balancers use it.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trident {

enum class ServingStatus { kUnknown, kServing, kNotServing, kServiceUnknown };

absl::string_view ServingStatusName(ServingStatus status);

// Asks `address` ("host:port") for the health of `service` ("" = the whole
// server). Returns the RPC's error (kUnavailable if nothing answers,
// kNotFound for a service the server does not know, kDeadlineExceeded after
// `timeout`). Thread-safe.
absl::StatusOr<ServingStatus> CheckHealth(absl::string_view address, absl::string_view service,
                                          absl::Duration timeout = absl::Seconds(5));

}  // namespace trident

#endif  // TRIDENT_COMMON_GRPC_HEALTH_CLIENT_H_
