#include "common/service/service_runtime.h"

#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

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
#include "common/grpc/tls.h"
#include "common/logging/log.h"
#include "common/process/shutdown_signal.h"
#include "common/status/status_macros.h"
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

ABSL_FLAG(std::string, tls_cert_file, "",
          "PEM certificate chain of this service. With --tls_key_file, the gRPC port serves TLS "
          "and outbound channels to other services present it (mTLS). Re-read every "
          "--tls_refresh_interval (mount a Secret as a directory, never with subPath). Empty: "
          "plaintext.");
ABSL_FLAG(std::string, tls_key_file, "", "PEM private key of --tls_cert_file.");
ABSL_FLAG(std::string, tls_ca_file, "",
          "PEM CA bundle that peers' certificates must chain to: servers this service calls, "
          "and clients when --tls_client_auth asks for certificates.");
ABSL_FLAG(std::string, tls_client_auth, "",
          "With TLS: require (mTLS: a client certificate of --tls_ca_file is required), optional "
          "(verified when sent) or none. Empty: the service's default (require; optional on the "
          "router, whose public clients authenticate with API keys).");
ABSL_FLAG(bool, tls_verify_hostname, true,
          "With TLS: outbound channels check that the server's certificate names the host "
          "dialled (DNS or IP SAN). False: any certificate of --tls_ca_file is accepted (peers "
          "dialled by pod IP).");
ABSL_FLAG(absl::Duration, tls_refresh_interval, absl::Seconds(60),
          "How often the --tls_* files are re-read; new material applies to new connections.");
ABSL_FLAG(int, grpc_max_message_bytes, -1,
          "Largest gRPC message received or sent; larger ones are refused with "
          "RESOURCE_EXHAUSTED. -1: the service's default (16 MiB on the router, 64 MiB "
          "elsewhere).");
ABSL_FLAG(int, grpc_max_metadata_bytes, 16 << 10, "Largest request metadata (headers) accepted.");
ABSL_FLAG(int, grpc_max_concurrent_streams, 4096,
          "Calls at once on one client connection; further calls wait in the client.");

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

static absl::StatusOr<TlsFiles> TlsFilesFromFlags(const ServiceDefaults& defaults) {
  TlsFiles files;
  files.cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  files.key_file = absl::GetFlag(FLAGS_tls_key_file);
  files.ca_file = absl::GetFlag(FLAGS_tls_ca_file);
  files.verify_hostname = absl::GetFlag(FLAGS_tls_verify_hostname);
  files.refresh_interval = absl::GetFlag(FLAGS_tls_refresh_interval);
  const std::string auth = absl::GetFlag(FLAGS_tls_client_auth);
  if (auth.empty()) {
    files.client_auth = defaults.client_auth;
  } else {
    TRIDENT_ASSIGN_OR_RETURN(files.client_auth, ParseClientAuth(auth));
  }
  return files;
}

absl::Status ServiceRuntime::Serve(std::vector<RegisteredService> services,
                                   const ServeHooks& hooks) {
  GrpcServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = PortFlag(absl::GetFlag(FLAGS_port), defaults_.grpc_port);
  const int max_message = absl::GetFlag(FLAGS_grpc_max_message_bytes);
  options.max_message_bytes = max_message == -1 ? defaults_.max_message_bytes : max_message;
  options.max_metadata_bytes = absl::GetFlag(FLAGS_grpc_max_metadata_bytes);
  options.max_concurrent_streams = absl::GetFlag(FLAGS_grpc_max_concurrent_streams);
  if (options.max_message_bytes <= 0 || options.max_metadata_bytes <= 0 ||
      options.max_concurrent_streams <= 0) {
    return absl::InvalidArgumentError(
        "--grpc_max_message_bytes, --grpc_max_metadata_bytes and --grpc_max_concurrent_streams "
        "must be positive");
  }
  options.credentials = server_credentials_;
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

absl::Status ServiceRuntime::SetUpTls() {
  TRIDENT_ASSIGN_OR_RETURN(TlsFiles files, TlsFilesFromFlags(defaults_));
  if (!files.enabled()) return absl::OkStatus();
  TRIDENT_ASSIGN_OR_RETURN(server_credentials_, TlsServerCredentials(files));
  TRIDENT_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> channel,
                           TlsChannelCredentials(files));
  SetClusterChannelCredentials(std::move(channel));
  TRIDENT_LOG(INFO) << "TLS on: certificate " << files.cert_file << ", CA " << files.ca_file
                    << ", client certificates " << ClientAuthName(files.client_auth)
                    << ", re-read every " << files.refresh_interval;
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
  if (runtime.ok()) {
    if (absl::Status tls = (*runtime)->SetUpTls(); !tls.ok()) runtime = tls;
  }
  absl::Status status = runtime.ok() ? body(**runtime) : runtime.status();
  if (runtime.ok()) {
    // The process is exiting: leave the /metrics endpoint to the OS rather
    // than stopping its HTTP server, which takes up to a second.
    ServiceRuntime* left = runtime->release();
#if defined(__SANITIZE_ADDRESS__)
    // Left to the OS on purpose: not a leak for LeakSanitizer.
    __lsan_ignore_object(left);
#else
    (void)left;
#endif
  }
  if (!status.ok()) {
    TRIDENT_LOG(ERROR) << defaults.component << " failed: " << status;
    return 1;
  }
  return 0;
}

}  // namespace trident
