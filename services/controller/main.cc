// The controller: membership, topology, and prefill/decode role decisions
// from Prometheus metrics.

#include <string>

#include "absl/flags/flag.h"
#include "common/logging/log.h"
#include "common/service/service_runtime.h"
#include "services/controller/controller_service.h"

ABSL_FLAG(std::string, prometheus_url, "",
          "Base URL of the Prometheus server whose metrics drive role decisions, e.g. "
          "http://127.0.0.1:9090; empty: no role decisions.");

int main(int argc, char** argv) {
  return trident::RunServiceMain(
      argc, argv, {.component = "controller", .grpc_port = 50054, .metrics_port = 9404},
      [](trident::ServiceRuntime& runtime) -> absl::Status {
        const std::string prometheus = absl::GetFlag(FLAGS_prometheus_url);
        TRIDENT_LOG(INFO) << "controller; Prometheus at "
                          << (prometheus.empty() ? std::string("(none)") : prometheus);
        trident::controller::ControllerService controller;
        return runtime.Serve({{&controller, trident::v1::Controller::service_full_name()}});
      });
}
