#include "services/router/admission/worker_load.h"

namespace trident::router::admission {

absl::string_view WorkerRoleName(WorkerRole role) {
  switch (role) {
    case WorkerRole::kPrefill:
      return "prefill";
    case WorkerRole::kDecode:
      return "decode";
    case WorkerRole::kBoth:
      return "both";
  }
  return "unknown";
}

}  // namespace trident::router::admission
