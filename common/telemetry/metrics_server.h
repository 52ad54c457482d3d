#ifndef TRIDENT_COMMON_TELEMETRY_METRICS_SERVER_H_
#define TRIDENT_COMMON_TELEMETRY_METRICS_SERVER_H_

// A Prometheus registry and the HTTP endpoint (`/metrics`) that serves it.
// Every service owns one. Components register their metric families in the
// registry once, at construction (see STYLE: one metrics struct a component).

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace trident::telemetry {

struct MetricsServerOptions {
  // Address to bind the HTTP endpoint, e.g. "0.0.0.0" or "127.0.0.1".
  std::string host = "0.0.0.0";
  // Port to bind; 0 lets the system pick a free one (see port()).
  int port = 0;
  // Component name, e.g. "router": exported as
  // trident_<component>_build_info{version} and
  // trident_<component>_start_time_seconds.
  std::string component;
};

// Thread-safe (prometheus-cpp's registry and exposer are).
class MetricsServer {
 public:
  // Binds and starts serving `/metrics`. Returns kUnavailable when the
  // address cannot be bound, kInvalidArgument for a bad port or component.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const MetricsServerOptions& options);

  // The registry every metric of this process goes into.
  prometheus::Registry& registry() { return *registry_; }

  // The bound port (the system's choice when the options asked for 0).
  int port() const { return port_; }

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer,
                std::shared_ptr<prometheus::Registry> registry, int port)
      : exposer_(std::move(exposer)), registry_(std::move(registry)), port_(port) {}

  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  const int port_;
};

// The version string every binary reports (build_info, --version).
absl::string_view TridentVersion();

}  // namespace trident::telemetry

#endif  // TRIDENT_COMMON_TELEMETRY_METRICS_SERVER_H_
