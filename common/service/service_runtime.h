#ifndef TRIDENT_COMMON_SERVICE_SERVICE_RUNTIME_H_
#define TRIDENT_COMMON_SERVICE_SERVICE_RUNTIME_H_

// What every Trident service process shares: the flags below, the metrics
// endpoint, the gRPC server (health, reflection), the readiness report to a
// launcher, and the drain on SIGTERM/SIGINT. A service's main.cc is:
//
//   int main(int argc, char** argv) {
//     return trident::RunServiceMain(argc, argv, {"router", 50051, 9401},
//         [](trident::ServiceRuntime& runtime) -> absl::Status {
//           RouterService service(runtime.registry());
//           return runtime.Serve({{&service, "trident.v1.Generation"}});
//         });
//   }
//
// Flags (shared by every service):
//   --host            address to bind gRPC and /metrics (default 0.0.0.0)
//   --port            gRPC port; 0 picks a free one; -1 = the service's default
//   --metrics_port    /metrics port; 0 picks a free one; -1 = the service's default
//   --ready_fd        file descriptor to which one JSON line is written once
//                     serving: {"component":..,"grpc_port":..,"metrics_port":..,"pid":..}
//   --drain_timeout   how long calls in flight may finish after SIGTERM
//   --log_level       debug, info, warning, error
//   --tls_cert_file, --tls_key_file, --tls_ca_file, --tls_client_auth,
//   --tls_verify_hostname, --tls_refresh_interval
//                     TLS on the gRPC port and mTLS to other services
//                     (common/grpc/tls.h)
//   --grpc_max_message_bytes, --grpc_max_metadata_bytes,
//   --grpc_max_concurrent_streams
//                     the gRPC server's limits (common/grpc/server.h)

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grpc/server.h"
#include "common/grpc/tls.h"
#include "common/telemetry/metrics_server.h"
#include "prometheus/registry.h"

namespace trident {

// Where a serving process is bound, for ServeHooks::on_serving.
struct ServingPorts {
  // The --host flag: the address bound, possibly a wildcard (0.0.0.0).
  std::string host;
  int grpc_port = 0;
  int metrics_port = 0;
};

// What a service runs around its serving life (e.g. joining and leaving the
// controller's membership). Both run on the main thread.
struct ServeHooks {
  // Once the gRPC server serves, with the bound ports, before readiness is
  // reported.
  std::function<void(const ServingPorts&)> on_serving;
  // After the shutdown signal, before the drain starts: calls in flight
  // still finish after it.
  std::function<void()> on_drain;
};

struct ServiceDefaults {
  // Lower-case component name: "router", "worker", "attention", "controller".
  std::string component;
  int grpc_port;
  int metrics_port;
  // --grpc_max_message_bytes's default.
  int max_message_bytes = 64 << 20;
  // --tls_client_auth's default.
  ClientAuth client_auth = ClientAuth::kRequire;
};

// Confined to the main thread.
class ServiceRuntime {
 public:
  // Reads the shared flags and starts the metrics endpoint. Returns
  // kInvalidArgument for bad flag values, kUnavailable if a port is taken.
  static absl::StatusOr<std::unique_ptr<ServiceRuntime>> Create(const ServiceDefaults& defaults);

  prometheus::Registry& registry() { return metrics_->registry(); }
  const std::string& component() const { return defaults_.component; }

  // Starts the gRPC server with `services`, runs hooks.on_serving, reports
  // readiness, then blocks until SIGTERM or SIGINT, runs hooks.on_drain,
  // drains (see GrpcServer::Drain) and returns OK. Returns an error at once
  // if the server cannot start.
  absl::Status Serve(std::vector<RegisteredService> services, const ServeHooks& hooks = {});

  // Reads the --tls_* flags: with a certificate, the server will serve TLS
  // and every outbound cluster channel (ClusterChannelCredentials) presents
  // it. INVALID_ARGUMENT naming the flag for bad files. RunServiceMain calls
  // it before the body runs.
  absl::Status SetUpTls();

 private:
  ServiceRuntime(ServiceDefaults defaults, std::unique_ptr<telemetry::MetricsServer> metrics)
      : defaults_(std::move(defaults)), metrics_(std::move(metrics)) {}

  const ServiceDefaults defaults_;
  std::unique_ptr<telemetry::MetricsServer> metrics_;
  // Null: plaintext.
  std::shared_ptr<grpc::ServerCredentials> server_credentials_;
};

// Blocks the shutdown signals, parses flags (with --help and --version),
// initializes logging, creates the runtime and runs `body`, which normally
// ends by returning runtime.Serve(...). Returns the process exit code: 0 when
// `body` returns OK, 1 (after logging the status) otherwise.
int RunServiceMain(int argc, char** argv, const ServiceDefaults& defaults,
                   const std::function<absl::Status(ServiceRuntime&)>& body);

}  // namespace trident

#endif  // TRIDENT_COMMON_SERVICE_SERVICE_RUNTIME_H_
