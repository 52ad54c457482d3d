#include "common/controller_client/channel.h"

#include <algorithm>

namespace trident::controller_client {

std::shared_ptr<grpc::Channel> ControllerChannel(const std::string& address,
                                                 const BackoffOptions& backoff) {
  grpc::ChannelArguments args;
  const int initial_ms =
      static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(backoff.initial)));
  const int max_ms = static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(backoff.max), initial_ms, 120'000));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, initial_ms);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_ms);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

}  // namespace trident::controller_client
