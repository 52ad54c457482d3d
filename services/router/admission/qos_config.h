#ifndef TRIDENT_SERVICES_ROUTER_ADMISSION_QOS_CONFIG_H_
#define TRIDENT_SERVICES_ROUTER_ADMISSION_QOS_CONFIG_H_

// QoS classes the router admits requests under, loaded from a JSON file.
//
// Schema (testdata/qos_classes.json is a complete example):
//
//   {
//     "classes": [                      required, 1 to 64 entries
//       {
//         "name": "interactive",        required; 1-64 printable ASCII bytes
//                                       (0x21-0x7E), unique
//         "is_default": true,           optional, default false; exactly one
//                                       class has it (a lone class is the
//                                       default without it)
//         "priority": 10,               optional integer, default 0; higher
//                                       is served first (worker queues)
//         "sheddable": false,           optional, default false; informational
//                                       (ModelInfo), admission treats all
//                                       classes alike apart from reservations
//         "default_slo": {              optional; targets for requests that
//           "ttft_ms": 500,             leave SloTargets fields unset; each
//           "tpot_ms": 50               optional, a positive number; a target
//         },                            left out means none
//         "reserved_fraction": 0.3      optional, in [0, 1], default 0
//       }
//     ]
//   }
//
// `reserved_fraction` reserves that share of the cluster's capacity for the
// class: of every decode worker's KV blocks and of every prefill worker's
// prefill token queue (AdmissionOptions::prefill_queue_capacity_tokens).
// Capacity reserved for a class and not in use by it is unavailable to other
// classes. The fractions sum to at most 1. Unknown keys are errors (they are
// usually typos), as are repeated keys.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"

namespace trident::router::admission {

// One class, validated.
struct QosClass {
  std::string name;
  bool is_default = false;
  int32_t priority = 0;
  bool sheddable = false;
  absl::optional<absl::Duration> default_ttft;
  absl::optional<absl::Duration> default_tpot;
  double reserved_fraction = 0;
};

// A validated set of classes. Value type.
struct QosConfig {
  // In file order.
  std::vector<QosClass> classes;
  // Index into `classes` of the default class.
  int default_index = 0;

  // Index of the class named `name`, the default for an empty name, or -1.
  int Find(absl::string_view name) const;

  // One class "default": no SLO targets, no reservation.
  static QosConfig SingleDefaultClass();
};

// Parses and validates a config. Returns kInvalidArgument whose message
// starts with `source` (a file name) and names the offending field, e.g.
// "qos.json: classes[1].default_slo.ttft_ms: must be a positive number".
absl::StatusOr<QosConfig> ParseQosConfig(absl::string_view json_text, absl::string_view source);

// Reads `path` and parses it. kNotFound naming the path if it cannot be read;
// otherwise as ParseQosConfig.
absl::StatusOr<QosConfig> LoadQosConfigFile(const std::string& path);

}  // namespace trident::router::admission

#endif  // TRIDENT_SERVICES_ROUTER_ADMISSION_QOS_CONFIG_H_
