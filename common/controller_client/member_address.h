#ifndef TRIDENT_COMMON_CONTROLLER_CLIENT_MEMBER_ADDRESS_H_
#define TRIDENT_COMMON_CONTROLLER_CLIENT_MEMBER_ADDRESS_H_

// How a member names itself in its registration: the gRPC and metrics
// addresses other processes reach it at, and the node it runs on.

#include <string>

#include "absl/strings/string_view.h"

namespace trident::controller_client {

struct MemberAddresses {
  // host:port of the member's gRPC server.
  std::string address;
  // host:port of its /metrics endpoint.
  std::string metrics_address;
  // The node (host) it runs on.
  std::string node_name;
};

// `advertise_address` (host:port, e.g. a pod's DNS name; a flag) names the
// gRPC server when set, and its host the metrics endpoint. Otherwise both
// use `bind_host` (the --host flag) unless it is a wildcard ("", 0.0.0.0,
// ::, [::]), in which case the machine's host name, with the bound ports.
// The node name is $NODE_NAME when set (a Kubernetes pod gets its node's
// name there through the downward API), else the host name.
MemberAddresses AdvertisedAddresses(absl::string_view advertise_address,
                                    absl::string_view bind_host, int grpc_port, int metrics_port);

// The host of "host:port" ("[::1]:5" gives "[::1]"); the whole text when it
// has no port.
absl::string_view HostOf(absl::string_view address);

// "host:port", bracketing a bare IPv6 literal.
std::string JoinHostPort(absl::string_view host, int port);

// The machine's host name; "localhost" if it cannot be read.
std::string HostName();

}  // namespace trident::controller_client

#endif  // TRIDENT_COMMON_CONTROLLER_CLIENT_MEMBER_ADDRESS_H_
