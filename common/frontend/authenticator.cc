#include "common/frontend/authenticator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace trident::frontend {

absl::StatusOr<std::string> QosClassFor(const Principal& principal, const std::string& requested) {
  const std::string qos = requested.empty() ? principal.default_qos_class : requested;
  if (principal.qos_classes.empty() || qos.empty() ||
      std::find(principal.qos_classes.begin(), principal.qos_classes.end(), qos) !=
          principal.qos_classes.end()) {
    return qos;
  }
  return absl::PermissionDeniedError(
      absl::StrCat("qos_class: the API key of tenant \"", principal.tenant, "\" may use ",
                   absl::StrJoin(principal.qos_classes, ", "), "; not \"", qos, "\""));
}

}  // namespace trident::frontend
