#include "common/controller_client/member_address.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace trident::controller_client {
namespace {

bool IsWildcard(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

}  // namespace

absl::string_view HostOf(absl::string_view address) {
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    return close == absl::string_view::npos ? address : address.substr(0, close + 1);
  }
  const size_t colon = address.rfind(':');
  // A bare IPv6 literal has several colons and no port.
  if (colon == absl::string_view::npos || address.find(':') != colon) return address;
  return address.substr(0, colon);
}

std::string JoinHostPort(absl::string_view host, int port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

MemberAddresses AdvertisedAddresses(absl::string_view advertise_address,
                                    absl::string_view bind_host, int grpc_port, int metrics_port) {
  MemberAddresses addresses;
  if (!advertise_address.empty()) {
    addresses.address = std::string(advertise_address);
    addresses.metrics_address = JoinHostPort(HostOf(advertise_address), metrics_port);
  } else {
    const std::string host = IsWildcard(bind_host) ? HostName() : std::string(bind_host);
    addresses.address = JoinHostPort(host, grpc_port);
    addresses.metrics_address = JoinHostPort(host, metrics_port);
  }
  const char* node = std::getenv("NODE_NAME");
  addresses.node_name = node != nullptr && node[0] != '\0' ? std::string(node) : HostName();
  return addresses;
}

}  // namespace trident::controller_client
