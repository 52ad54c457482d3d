#include "common/service/service_runtime.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/fault/fault_points.h"
#include "common/grpc/callback_queue_anchor.h"
#include "common/logging/log.h"
#include "common/process/shutdown_signal.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to bind the gRPC server and /metrics.");
ABSL_FLAG(int, port, -1, "gRPC port. 0 picks a free port; -1 uses the service's default.");
ABSL_FLAG(int, metrics_port, -1,
          "Prometheus /metrics port. 0 picks a free port; -1 uses the service's default.");
ABSL_FLAG(int, ready_fd, -1,
          "If >= 0, a file descriptor to which one JSON line with the bound ports is written "
          "once the service is serving; the descriptor is then closed. Used by launchers.");
ABSL_FLAG(std::string, fault_points, "",
          "For fault-injection tests only: named fault points to arm, e.g. "
          "\"decode.token=crash@20\" (common/fault/fault_points.h). Empty: none.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(3),
          "After SIGTERM or SIGINT, how long calls in flight may run before they are "
          "cancelled. The process exits 0 once they have ended.");

namespace trident {
namespace {

int PortFlag(int flag_value, int default_port) {
  return flag_value == -1 ? default_port : flag_value;
}

absl::Status ReportReady(int fd, const std::string& component, int grpc_port, int metrics_port) {
  if (fd < 0) return absl::OkStatus();
  const nlohmann::json report = {{"component", component},
                                 {"grpc_port", grpc_port},
                                 {"metrics_port", metrics_port},
                                 {"pid", static_cast<int>(getpid())}};
  const std::string line = report.dump() + "\n";
  size_t written = 0;
  while (written < line.size()) {
    const ssize_t n = write(fd, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("--ready_fd=", fd, ": write failed: ", std::strerror(error)));
    }
    written += static_cast<size_t>(n);
  }
  close(fd);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServiceRuntime>> ServiceRuntime::Create(
    const ServiceDefaults& defaults) {
  telemetry::MetricsServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = PortFlag(absl::GetFlag(FLAGS_metrics_port), defaults.metrics_port);
  options.component = defaults.component;
  absl::StatusOr<std::unique_ptr<telemetry::MetricsServer>> metrics =
      telemetry::MetricsServer::Start(options);
  if (!metrics.ok()) return metrics.status();
  return std::unique_ptr<ServiceRuntime>(new ServiceRuntime(defaults, *std::move(metrics)));
}

absl::Status ServiceRuntime::Serve(std::vector<RegisteredService> services,
                                   const ServeHooks& hooks) {
  GrpcServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = PortFlag(absl::GetFlag(FLAGS_port), defaults_.grpc_port);
  absl::StatusOr<std::unique_ptr<GrpcServer>> server = GrpcServer::Start(options, services);
  if (!server.ok()) return server.status();
  TRIDENT_LOG(INFO) << defaults_.component << " serving gRPC on " << options.host << ":"
                    << (*server)->port() << ", /metrics on port " << metrics_->port();
  if (hooks.on_serving) {
    hooks.on_serving(
        {.host = options.host, .grpc_port = (*server)->port(), .metrics_port = metrics_->port()});
  }
  absl::Status ready = ReportReady(absl::GetFlag(FLAGS_ready_fd), defaults_.component,
                                   (*server)->port(), metrics_->port());
  if (!ready.ok()) {
    (*server)->Drain(absl::Now());
    return ready;
  }

  const int signal_number = WaitForShutdownSignal();
  const absl::Duration drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  TRIDENT_LOG(INFO) << "signal " << signal_number << ": draining for at most " << drain_timeout;
  if (hooks.on_drain) hooks.on_drain();
  const absl::Time start = absl::Now();
  (*server)->Drain(start + drain_timeout);
  TRIDENT_LOG(INFO) << defaults_.component << " drained in " << (absl::Now() - start);
  return absl::OkStatus();
}

int RunServiceMain(int argc, char** argv, const ServiceDefaults& defaults,
                   const std::function<absl::Status(ServiceRuntime&)>& body) {
  BlockShutdownSignals();
  absl::FlagsUsageConfig usage_config;
  // --help lists the flags of Trident's own code, not those of libraries.
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "services/") || absl::StrContains(file, "common/");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  usage_config.version_string = [] {
    return absl::StrCat("trident ", telemetry::TridentVersion(), "\n");
  };
  absl::SetFlagsUsageConfig(usage_config);
  absl::SetProgramUsageMessage(absl::StrCat("Trident ", defaults.component,
                                            " service.\nUsage: ", defaults.component, " [flags]"));
  absl::ParseCommandLine(argc, argv);
  if (absl::Status armed = fault::ArmFaultPoints(absl::GetFlag(FLAGS_fault_points));
      !armed.ok()) {
    std::fprintf(stderr, "%s\n", std::string(armed.message()).c_str());
    return 2;
  }
  // The callback API's shared queue lives as long as the process, so that it
  // is never torn down (and rebuilt) while calls come and go.
  AnchorCallbackCompletionQueue();
  log::InitLoggingFromFlags();

  absl::StatusOr<std::unique_ptr<ServiceRuntime>> runtime = ServiceRuntime::Create(defaults);
  absl::Status status = runtime.ok() ? body(**runtime) : runtime.status();
  if (runtime.ok()) {
    // The process is exiting: leave the /metrics endpoint to the OS rather
    // than stopping its HTTP server, which takes up to a second.
    (void)runtime->release();
  }
  if (!status.ok()) {
    TRIDENT_LOG(ERROR) << defaults.component << " failed: " << status;
    return 1;
  }
  return 0;
}

}  // namespace trident
