// The router: Trident's public gRPC endpoint (trident.v1.Generation).

#include <string>

#include "absl/flags/flag.h"
#include "common/service/service_runtime.h"
#include "services/router/generation_service.h"

ABSL_FLAG(std::string, controller_address, "",
          "host:port of the controller whose topology lists the workers; empty: none.");

int main(int argc, char** argv) {
  return trident::RunServiceMain(
      argc, argv, {.component = "router", .grpc_port = 50051, .metrics_port = 9401},
      [](trident::ServiceRuntime& runtime) {
        trident::router::GenerationService generation;
        return runtime.Serve({{&generation, trident::v1::Generation::service_full_name()}});
      });
}
