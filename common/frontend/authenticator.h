#ifndef TRIDENT_COMMON_FRONTEND_AUTHENTICATOR_H_
#define TRIDENT_COMMON_FRONTEND_AUTHENTICATOR_H_

// Who is calling the public Generation API, and what they may ask for. The
// router authenticates callers by API key (services/router/auth); a service
// without an authenticator serves everyone.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace trident::frontend {

struct Principal {
  // The tenant the caller's key belongs to.
  std::string tenant;
  // QoS classes the caller may ask for; empty: any.
  std::vector<std::string> qos_classes;
  // The class a request that names none gets; empty: the server's default.
  std::string default_qos_class;
};

class Authenticator {
 public:
  virtual ~Authenticator() = default;
  // The caller of `context`; UNAUTHENTICATED when its credentials are
  // missing or unknown. Thread-safe; must not block.
  virtual absl::StatusOr<Principal> Authenticate(const grpc::CallbackServerContext& context) = 0;
};

// The QoS class a request of `principal` runs in: `requested`, or the
// principal's default when empty. PERMISSION_DENIED (naming qos_class) when
// the principal may not use it.
absl::StatusOr<std::string> QosClassFor(const Principal& principal, const std::string& requested);

}  // namespace trident::frontend

#endif  // TRIDENT_COMMON_FRONTEND_AUTHENTICATOR_H_
