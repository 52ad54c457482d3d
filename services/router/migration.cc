#include "services/router/migration.h"

namespace trident::router {

bool IsMigratable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kAborted;
}

}  // namespace trident::router
