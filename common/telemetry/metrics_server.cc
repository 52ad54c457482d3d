#include "common/telemetry/metrics_server.h"

#include <exception>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "prometheus/gauge.h"

namespace trident::telemetry {
namespace {

bool IsValidComponent(absl::string_view component) {
  if (component.empty()) return false;
  for (char c : component) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '_') return false;
  }
  return true;
}

}  // namespace

absl::string_view TridentVersion() { return "0.1.0"; }

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const MetricsServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics port must be in [0, 65535], got ", options.port));
  }
  if (!IsValidComponent(options.component)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "component name '", options.component, "' must be lower-case letters, digits or '_'"));
  }
  const std::string address = absl::StrCat(options.host, ":", options.port);
  std::unique_ptr<prometheus::Exposer> exposer;
  // prometheus-cpp reports a failed bind by throwing; this is the boundary
  // where that becomes a status.
  try {
    exposer = std::make_unique<prometheus::Exposer>(address, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", address, ": ", e.what()));
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot serve /metrics on ", address));
  }
  auto registry = std::make_shared<prometheus::Registry>();
  const std::string prefix = absl::StrCat("trident_", options.component);
  prometheus::BuildGauge()
      .Name(prefix + "_build_info")
      .Help("Always 1; the labels tell which Trident build is running.")
      .Register(*registry)
      .Add({{"version", std::string(TridentVersion())}})
      .Set(1);
  prometheus::BuildGauge()
      .Name(prefix + "_start_time_seconds")
      .Help("Unix time at which the process started serving.")
      .Register(*registry)
      .Add({})
      .Set(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  exposer->RegisterCollectable(registry);
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(exposer), registry, ports[0]));
}

}  // namespace trident::telemetry
