#include "common/controller_client/channel.h"

#include <algorithm>

#include "common/grpc/tls.h"

namespace trident::controller_client {

std::shared_ptr<grpc::Channel> ControllerChannel(const std::string& address,
                                                 const BackoffOptions& backoff) {
  grpc::ChannelArguments args;
  const int initial_ms =
      static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(backoff.initial), 1, 120'000));
  const int max_ms = static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(backoff.max), initial_ms, 120'000));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, initial_ms);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_ms);
  // A controller whose host vanished without closing the connection is
  // noticed by the HTTP/2 pings, not only when writes back up: a topology
  // watch only reads, and a heartbeat write completes into the socket
  // buffer. Servers accept pings this often (common/grpc/server.cc).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  return CreateClusterChannel(address, args);
}

}  // namespace trident::controller_client
