// The CPU attention service: holds offloaded sequences' KV in NUMA-local DRAM
// and computes their decode attention.

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/service/service_runtime.h"
#include "services/attention/attention_service.h"

ABSL_FLAG(int, numa_node, -1,
          "NUMA node whose cores and memory this process uses; -1 leaves placement to the OS.");

int main(int argc, char** argv) {
  return trident::RunServiceMain(
      argc, argv, {.component = "attention", .grpc_port = 50053, .metrics_port = 9403},
      [](trident::ServiceRuntime& runtime) -> absl::Status {
        const int numa_node = absl::GetFlag(FLAGS_numa_node);
        if (numa_node < -1) {
          return absl::InvalidArgumentError(
              absl::StrCat("--numa_node: must be -1 or a node number, got ", numa_node));
        }
        TRIDENT_LOG(INFO) << "attention service, NUMA node "
                          << (numa_node < 0 ? std::string("unbound") : absl::StrCat(numa_node));
        trident::attention::AttentionService attention;
        return runtime.Serve({{&attention, trident::v1::Attention::service_full_name()}});
      });
}
