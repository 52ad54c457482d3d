#ifndef TRIDENT_COMMON_CONTROLLER_CLIENT_CHANNEL_H_
#define TRIDENT_COMMON_CONTROLLER_CLIENT_CHANNEL_H_

// The gRPC channel controller clients use: insecure (the cluster's network
// is trusted, as for every Trident service), with its reconnect backoff set
// to the client's own bounds. gRPC's default (1 s growing to 120 s) would
// leave a channel refusing calls for up to two minutes after a controller
// came back, whatever the client's backoff says.

#include <memory>
#include <string>

#include "common/controller_client/backoff.h"
#include "grpcpp/grpcpp.h"

namespace trident::controller_client {

std::shared_ptr<grpc::Channel> ControllerChannel(const std::string& address,
                                                 const BackoffOptions& backoff);

}  // namespace trident::controller_client

#endif  // TRIDENT_COMMON_CONTROLLER_CLIENT_CHANNEL_H_
