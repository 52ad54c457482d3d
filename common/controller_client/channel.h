#ifndef TRIDENT_COMMON_CONTROLLER_CLIENT_CHANNEL_H_
#define TRIDENT_COMMON_CONTROLLER_CLIENT_CHANNEL_H_

// The gRPC channel controller clients use: insecure (the cluster's network
// is trusted, as for every Trident service), with its reconnect backoff set
// to the client's own bounds. gRPC's default (1 s growing to 120 s) would
// leave a channel refusing calls for up to two minutes after a controller
// came back, whatever the client's backoff says. Keepalive pings find a
// controller whose host vanished without closing the connection.

#include <memory>
#include <string>

#include "common/controller_client/backoff.h"
#include "grpcpp/grpcpp.h"

namespace trident::controller_client {

// How often an idle controller connection is pinged; a ping unanswered for
// 5 s closes it and the client reconnects.
inline constexpr int kKeepaliveTimeMs = 10'000;

std::shared_ptr<grpc::Channel> ControllerChannel(const std::string& address,
                                                 const BackoffOptions& backoff);

}  // namespace trident::controller_client

#endif  // TRIDENT_COMMON_CONTROLLER_CLIENT_CHANNEL_H_
