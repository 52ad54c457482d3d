#include "tools/cli/cluster.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/grpc/health_client.h"
#include "common/grpc/tls.h"
#include "common/http/http_client.h"
#include "common/logging/log.h"
#include "common/model/generate/model_gen.h"
#include "common/process/subprocess.h"
#include "common/status/status_macros.h"
#include "nlohmann/json.hpp"

namespace trident::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kStateFile[] = "cluster.json";

std::string StatePath(const std::string& state_dir) { return state_dir + "/" + kStateFile; }

bool IsExecutable(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && access(path.c_str(), X_OK) == 0;
}

std::string SelfExecutable() {
  std::error_code error;
  const fs::path path = fs::read_symlink("/proc/self/exe", error);
  return error ? "" : path.string();
}

// Finds a file of the build (`relative` to the workspace, `installed` its
// name beside the binaries): --bin_dir, then Bazel runfiles, then the build
// tree or install directory around the trident binary.
absl::StatusOr<std::string> FindBuildFile(const ClusterOptions& options,
                                          const std::string& relative,
                                          const std::string& installed) {
  std::vector<std::string> candidates;
  if (!options.bin_dir.empty()) {
    candidates.push_back(absl::StrCat(options.bin_dir, "/", installed));
  } else {
    if (const char* runfiles = std::getenv("RUNFILES_DIR"); runfiles != nullptr) {
      candidates.push_back(absl::StrCat(runfiles, "/trident/", relative));
    }
    const std::string self = SelfExecutable();
    if (!self.empty()) {
      const std::string dir = fs::path(self).parent_path().string();
      candidates.push_back(absl::StrCat(self, ".runfiles/trident/", relative));
      candidates.push_back(absl::StrCat(dir, "/../../", relative));
      candidates.push_back(absl::StrCat(dir, "/", installed));
    }
  }
  for (const std::string& candidate : candidates) {
    if (IsExecutable(candidate)) return fs::weakly_canonical(candidate).string();
  }
  return absl::NotFoundError(
      absl::StrCat("cannot find ", installed, "; looked in: ", absl::StrJoin(candidates, ", "),
                   ". Build it (bazel build //tools/cli:trident) or pass --bin_dir"));
}

absl::StatusOr<std::string> FindServiceBinary(const ClusterOptions& options,
                                              const std::string& component) {
  return FindBuildFile(options, absl::StrCat("services/", component, "/", component), component);
}

// A private CA and one certificate for every service of this machine's
// cluster (tools/tls/make_certs.sh), under <state_dir>/tls; the trident
// command's own channels use them from then on.
absl::StatusOr<std::string> MakeClusterCertificates(const ClusterOptions& options) {
  TRIDENT_ASSIGN_OR_RETURN(const std::string script,
                           FindBuildFile(options, "tools/tls/make_certs.sh", "make_certs.sh"));
  const std::string dir = absl::StrCat(options.state_dir, "/tls");
  const std::string log = absl::StrCat(options.state_dir, "/logs/tls.log");
  TRIDENT_ASSIGN_OR_RETURN(
      SpawnedProcess made,
      Spawn(
          {.argv = {script, dir, "trident", absl::StrCat("IP:", options.host)}, .log_path = log}));
  TRIDENT_ASSIGN_OR_RETURN(ExitInfo exit, WaitForExit(made.pid, absl::Seconds(30)));
  if (exit.exit_code != 0) {
    return absl::FailedPreconditionError(absl::StrCat(script, " failed: ", TailOfFile(log)));
  }
  TRIDENT_RETURN_IF_ERROR(UseClusterTls(dir));
  return dir;
}

absl::StatusOr<std::string> FindInPath(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (IsExecutable(name)) return name;
    return absl::NotFoundError(absl::StrCat(name, " is not an executable file"));
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path == nullptr ? "/usr/bin:/bin" : path, ':')) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (IsExecutable(candidate)) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("cannot find '", name,
                                          "' in PATH; install Debian's prometheus package "
                                          "(tools/bootstrap.sh does) or pass --prometheus_bin"));
}

// Asks the kernel for a free loopback port. Prometheus cannot report a port
// it picked itself, and the controller must know its URL before it starts, so
// it gets one chosen here; another process could take it before Prometheus
// binds, in which case `trident up` fails with Prometheus's log.
absl::StatusOr<int> PickFreePort(const std::string& host) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = 0;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  close(fd);
  if (!ok) return absl::UnavailableError(absl::StrCat("cannot pick a free port on ", host));
  return static_cast<int>(ntohs(address.sin_port));
}

json ToJson(const ClusterState& state) {
  json processes = json::array();
  for (const ProcessRecord& p : state.processes) {
    processes.push_back({{"name", p.name},
                         {"component", p.component},
                         {"pid", static_cast<int>(p.pid)},
                         {"grpc_port", p.grpc_port},
                         {"metrics_port", p.metrics_port},
                         {"log", p.log_path},
                         {"role", p.role},
                         {"argv", p.argv}});
  }
  return {{"host", state.host}, {"tls_dir", state.tls_dir}, {"processes", processes}};
}

absl::Status WriteState(const std::string& state_dir, const ClusterState& state) {
  const std::string path = StatePath(state_dir);
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary);
    out << ToJson(state).dump(2) << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", temporary));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("cannot rename ", temporary, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// Stops processes in reverse start order; best effort.
void StopAll(const std::vector<ProcessRecord>& processes, absl::Duration timeout) {
  for (auto it = processes.rbegin(); it != processes.rend(); ++it) {
    if (!IsRunning(it->pid)) continue;
    kill(it->pid, SIGTERM);
    if (!WaitForExit(it->pid, timeout).ok() && IsRunning(it->pid)) {
      TRIDENT_LOG(WARNING) << it->name << " (pid " << it->pid << ") did not stop within " << timeout
                           << "; killing it";
      kill(it->pid, SIGKILL);
      (void)WaitForExit(it->pid, absl::Seconds(5));
    }
  }
}

// Spawns `record.argv`, waits for its ready line and health, and fills in
// its pid and ports.
absl::Status SpawnService(const std::string& host, absl::Duration ready_timeout,
                          ProcessRecord& record) {
  const std::string& name = record.name;
  absl::StatusOr<SpawnedProcess> spawned = Spawn({.argv = record.argv,
                                                  .log_path = record.log_path,
                                                  .new_session = true,
                                                  .wait_for_ready_line = true,
                                                  .ready_timeout = ready_timeout});
  if (!spawned.ok()) {
    return absl::Status(spawned.status().code(),
                        absl::StrCat("starting ", name, ": ", spawned.status().message()));
  }
  record.pid = spawned->pid;
  const json ready = json::parse(spawned->ready_line, nullptr, /*allow_exceptions=*/false);
  if (!ready.is_object() || !ready.contains("grpc_port") || !ready.contains("metrics_port")) {
    kill(record.pid, SIGKILL);
    return absl::InternalError(
        absl::StrCat(name, " reported a malformed ready line: ", spawned->ready_line));
  }
  record.grpc_port = ready["grpc_port"].get<int>();
  record.metrics_port = ready["metrics_port"].get<int>();

  // The ready line is written once serving; confirm it the way a load
  // balancer would, through the standard health service.
  absl::StatusOr<ServingStatus> health =
      CheckHealth(record.GrpcAddress(host), "", absl::Seconds(10));
  if (!health.ok() || *health != ServingStatus::kServing) {
    kill(record.pid, SIGKILL);
    return absl::UnavailableError(absl::StrCat(
        name, " reported ready but its health check says ",
        health.ok() ? std::string(ServingStatusName(*health)) : health.status().ToString()));
  }
  TRIDENT_LOG(INFO) << name << " SERVING on " << record.GrpcAddress(host)
                    << ", metrics on port " << record.metrics_port << " (pid " << record.pid << ")";
  return absl::OkStatus();
}

// `port`: the gRPC port (0: the system picks one).
absl::StatusOr<ProcessRecord> StartService(const ClusterOptions& options,
                                           const std::string& component, const std::string& name,
                                           std::vector<std::string> extra_flags, int port = 0) {
  TRIDENT_ASSIGN_OR_RETURN(const std::string binary, FindServiceBinary(options, component));
  ProcessRecord record{.name = name, .component = component};
  record.log_path = absl::StrCat(options.state_dir, "/logs/", name, ".log");
  record.argv = {binary, absl::StrCat("--host=", options.host), absl::StrCat("--port=", port),
                 "--metrics_port=0",
                 absl::StrCat("--drain_timeout=", absl::FormatDuration(options.drain_timeout))};
  record.argv.insert(record.argv.end(), extra_flags.begin(), extra_flags.end());
  TRIDENT_RETURN_IF_ERROR(SpawnService(options.host, options.ready_timeout, record));
  return record;
}

absl::Status WaitForPrometheusReady(const std::string& url, pid_t pid, const std::string& log,
                                    absl::Duration timeout) {
  // Prometheus reports readiness only over HTTP, so this polls /-/ready.
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(20);
  while (true) {
    absl::StatusOr<http::HttpResponse> response =
        http::Get(absl::StrCat(url, "/-/ready"), absl::Seconds(2));
    if (response.ok() && response->status_code == 200) return absl::OkStatus();
    if (!IsRunning(pid)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "prometheus exited during start-up; its log (", log, ") ends with:\n", TailOfFile(log)));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("prometheus at ", url, " not ready after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
}

absl::StatusOr<ProcessRecord> StartPrometheus(const ClusterOptions& options,
                                              const ClusterState& state, int port) {
  TRIDENT_ASSIGN_OR_RETURN(const std::string binary, FindInPath(options.prometheus_bin));
  const std::string config_path = options.state_dir + "/prometheus.yml";
  {
    std::ofstream config(config_path);
    config << PrometheusConfig(state, options.scrape_interval);
    if (!config) return absl::InternalError(absl::StrCat("cannot write ", config_path));
  }
  ProcessRecord record{.name = "prometheus", .component = "prometheus", .metrics_port = port};
  record.log_path = options.state_dir + "/logs/prometheus.log";
  TRIDENT_ASSIGN_OR_RETURN(
      SpawnedProcess spawned,
      Spawn({.argv = {binary, absl::StrCat("--config.file=", config_path),
                      absl::StrCat("--storage.tsdb.path=", options.state_dir, "/prometheus"),
                      absl::StrCat("--web.listen-address=", options.host, ":", port),
                      "--storage.tsdb.retention.time=2d", "--log.level=warn"},
             .log_path = record.log_path,
             .new_session = true}));
  record.pid = spawned.pid;
  const std::string url = absl::StrCat("http://", options.host, ":", port);
  absl::Status ready =
      WaitForPrometheusReady(url, record.pid, record.log_path, options.ready_timeout);
  if (!ready.ok()) {
    kill(record.pid, SIGKILL);
    return ready;
  }
  TRIDENT_LOG(INFO) << "prometheus ready at " << url << " (pid " << record.pid << ")";
  return record;
}

// Creates the state directory and its logs/; kFailedPrecondition if a
// cluster started from it is still running.
absl::Status PrepareStateDir(const ClusterOptions& options) {
  if (options.state_dir.empty()) return absl::InvalidArgumentError("--state_dir is empty");
  std::error_code error;
  fs::create_directories(options.state_dir + "/logs", error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", options.state_dir, "/logs: ", error.message()));
  }
  if (absl::StatusOr<ClusterState> existing = LoadState(options.state_dir); existing.ok()) {
    for (const ProcessRecord& p : existing->processes) {
      if (IsRunning(p.pid)) {
        return absl::FailedPreconditionError(absl::StrCat("a cluster is already running from ",
                                                          options.state_dir, " (", p.name, ", pid ",
                                                          p.pid, "); run `trident down` first"));
      }
    }
  }
  return absl::OkStatus();
}

// options.model_dir, or the default model, generated on first use.
absl::StatusOr<std::string> ModelDir(const ClusterOptions& options) {
  if (!options.model_dir.empty()) return options.model_dir;
  const std::string dir = options.state_dir + "/models/llama3-tiny";
  if (access((dir + "/config.json").c_str(), F_OK) == 0) return dir;
  TRIDENT_ASSIGN_OR_RETURN(const model::generate::ModelSpec spec,
                           model::generate::PresetSpec("llama3-tiny"));
  TRIDENT_RETURN_IF_ERROR(model::generate::WriteModel(spec, dir));
  TRIDENT_LOG(INFO) << "generated a random-weight llama3-tiny model in " << dir;
  return dir;
}

// A worker's flags: its role and id, the model, a UCX KV transport, which a
// `both` worker would otherwise leave off (the router sends it KV too), and
// the controller to register with; then the user's flags, which override
// these.
std::vector<std::string> WorkerFlags(const ClusterOptions& options, const std::string& role,
                                     const std::string& name, const std::string& model_dir,
                                     const std::string& attention_address,
                                     const std::string& controller_address) {
  std::vector<std::string> flags = {absl::StrCat("--role=", role),
                                    absl::StrCat("--worker_id=", name),
                                    absl::StrCat("--model=", model_dir), "--kv_transport=ucx",
                                    absl::StrCat("--controller_address=", controller_address)};
  if (role != "prefill" && !attention_address.empty()) {
    // Decode-capable workers place sequences at the attention service when
    // their KV pool runs short (or, with offload_min_context_tokens, every
    // long one), and move one there only while the start-up cost tables say
    // the decode step keeps its throughput with it.
    flags.push_back(absl::StrCat("--attention_services=", attention_address));
    flags.push_back(
        absl::StrCat("--offload_min_context_tokens=", options.offload_min_context_tokens));
    flags.push_back("--offload_keep_throughput");
  }
  flags.insert(flags.end(), options.worker_flags.begin(), options.worker_flags.end());
  return flags;
}

// The router serves at once but routes only to workers it has a load report
// from; its load streams connect in the background, so this polls its
// /metrics until every worker shows there.
absl::Status WaitForRouterWorkers(const ClusterState& state, const ProcessRecord& router,
                                  const std::vector<std::string>& worker_ids,
                                  absl::Duration timeout) {
  const std::string url = absl::StrCat("http://", state.host, ":", router.metrics_port, "/metrics");
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(20);
  while (true) {
    absl::StatusOr<http::HttpResponse> response = http::Get(url, absl::Seconds(2));
    if (response.ok() && response->status_code == 200 &&
        RouterHasLoadOf(response->body, worker_ids)) {
      return absl::OkStatus();
    }
    if (!IsRunning(router.pid)) {
      return absl::FailedPreconditionError(absl::StrCat("the router exited; its log (",
                                                        router.log_path, ") ends with:\n",
                                                        TailOfFile(router.log_path)));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the router has no load report from some of ", absl::StrJoin(worker_ids, ", "), " after ",
          absl::FormatDuration(timeout), "; its log (", router.log_path, ") ends with:\n",
          TailOfFile(router.log_path)));
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
}

}  // namespace

std::string ProcessRecord::GrpcAddress(const std::string& host) const {
  return absl::StrCat(host, ":", grpc_port);
}

const ProcessRecord* ClusterState::Find(const std::string& name) const {
  for (const ProcessRecord& p : processes) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::string ClusterState::RouterAddress() const {
  const ProcessRecord* router = Find("router");
  return router == nullptr ? "" : router->GrpcAddress(host);
}

std::string ClusterState::PrometheusUrl() const {
  const ProcessRecord* prometheus = Find("prometheus");
  return prometheus == nullptr ? "" : absl::StrCat("http://", host, ":", prometheus->metrics_port);
}

std::string PrometheusConfig(const ClusterState& state, absl::Duration scrape_interval) {
  const std::string interval = absl::StrCat(absl::ToInt64Milliseconds(scrape_interval), "ms");
  std::ostringstream out;
  out << "# Generated by `trident up`: scrapes every service of this cluster.\n"
      << "global:\n"
      << "  scrape_interval: " << interval << "\n"
      << "  evaluation_interval: " << interval << "\n"
      << "scrape_configs:\n";
  // One job a component, as a Kubernetes ServiceMonitor gives; the instance
  // label tells processes of one component apart.
  for (const std::string component : {"router", "worker", "attention", "controller"}) {
    std::vector<const ProcessRecord*> members;
    for (const ProcessRecord& p : state.processes) {
      if (p.component == component) members.push_back(&p);
    }
    if (members.empty()) continue;
    out << "  - job_name: " << component << "\n"
        << "    static_configs:\n";
    for (const ProcessRecord* p : members) {
      out << "      - targets: ['" << state.host << ":" << p->metrics_port << "']\n"
          << "        labels:\n"
          << "          process: '" << p->name << "'\n";
    }
  }
  return out.str();
}

absl::Status ValidateWorkerRoles(const std::vector<std::string>& roles) {
  bool can_prefill = false;
  bool can_decode = false;
  for (const std::string& role : roles) {
    if (role != "prefill" && role != "decode" && role != "both") {
      return absl::InvalidArgumentError(
          absl::StrCat("--workers: each entry must be prefill, decode or both; got '", role, "'"));
    }
    can_prefill = can_prefill || role != "decode";
    can_decode = can_decode || role != "prefill";
  }
  if (!can_prefill || !can_decode) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--workers=", absl::StrJoin(roles, ","),
        ": the router needs a worker that can prefill (prefill or both) and one that can "
        "decode (decode or both)"));
  }
  return absl::OkStatus();
}

RouterWorkers RouterWorkersOf(const ClusterState& state) {
  RouterWorkers workers;
  for (const ProcessRecord& p : state.processes) {
    if (p.component != "worker") continue;
    if (p.role == "prefill" || p.role == "both")
      workers.prefill.push_back(p.GrpcAddress(state.host));
    if (p.role == "decode" || p.role == "both") workers.decode.push_back(p.GrpcAddress(state.host));
  }
  return workers;
}

bool RouterHasLoadOf(const std::string& metrics_text, const std::vector<std::string>& worker_ids) {
  for (const std::string& id : worker_ids) {
    const std::string series =
        absl::StrCat("trident_router_worker_running_sequences{worker=\"", id, "\"}");
    if (!absl::StrContains(metrics_text, series)) return false;
  }
  return true;
}

absl::StatusOr<ClusterState> Up(const ClusterOptions& options) {
  TRIDENT_RETURN_IF_ERROR(PrepareStateDir(options));
  TRIDENT_RETURN_IF_ERROR(ValidateWorkerRoles(options.worker_roles));
  TRIDENT_ASSIGN_OR_RETURN(const std::string model_dir, ModelDir(options));

  ClusterState state{.host = options.host};
  if (options.tls) {
    TRIDENT_ASSIGN_OR_RETURN(state.tls_dir, MakeClusterCertificates(options));
  }
  auto start = [&](const std::string& component, const std::string& name,
                   std::vector<std::string> flags, int port = 0) -> absl::Status {
    if (!state.tls_dir.empty()) {
      for (const char* file : {"cert", "key", "ca"}) {
        const std::string base = std::string(file) == "ca"     ? "ca.crt"
                                 : std::string(file) == "cert" ? "tls.crt"
                                                               : "tls.key";
        flags.push_back(absl::StrCat("--tls_", file, "_file=", state.tls_dir, "/", base));
      }
    }
    absl::StatusOr<ProcessRecord> record = StartService(options, component, name, flags, port);
    if (!record.ok()) return record.status();
    state.processes.push_back(*record);
    return WriteState(options.state_dir, state);
  };

  absl::Status status = [&]() -> absl::Status {
    TRIDENT_ASSIGN_OR_RETURN(const int prometheus_port, PickFreePort(options.host));
    // The controller keeps its port across restarts: members find it again.
    TRIDENT_ASSIGN_OR_RETURN(const int controller_port, PickFreePort(options.host));
    std::vector<std::string> controller_flags = {
        absl::StrCat("--prometheus_url=http://", options.host, ":", prometheus_port)};
    controller_flags.insert(controller_flags.end(), options.controller_flags.begin(),
                            options.controller_flags.end());
    TRIDENT_RETURN_IF_ERROR(start("controller", "controller", controller_flags, controller_port));
    // Every member registers with the controller and the router follows its
    // topology; the router also keeps the static worker lists, so that the
    // cluster serves even while the controller is down.
    const std::string controller_address = state.processes.back().GrpcAddress(state.host);
    const std::string controller_flag = absl::StrCat("--controller_address=", controller_address);
    TRIDENT_RETURN_IF_ERROR(
        start("attention", "attention-0",
              {"--service_id=attention-0", absl::StrCat("--threads=", options.attention_threads),
               absl::StrCat("--kv_budget_mb=", options.attention_kv_budget_mb),
               absl::StrCat("--kv_store_mb=", options.attention_kv_store_mb), controller_flag}));
    const std::string attention_address = state.processes.back().GrpcAddress(state.host);
    std::vector<std::string> worker_ids;
    for (size_t i = 0; i < options.worker_roles.size(); ++i) {
      const std::string& role = options.worker_roles[i];
      worker_ids.push_back(absl::StrCat("worker-", i));
      TRIDENT_RETURN_IF_ERROR(start("worker", worker_ids.back(),
                                    WorkerFlags(options, role, worker_ids.back(), model_dir,
                                                attention_address, controller_address)));
      state.processes.back().role = role;
      TRIDENT_RETURN_IF_ERROR(WriteState(options.state_dir, state));
    }
    const RouterWorkers workers = RouterWorkersOf(state);
    TRIDENT_RETURN_IF_ERROR(start(
        "router", "router",
        {absl::StrCat("--model=", model_dir),
         absl::StrCat("--prefill_workers=", absl::StrJoin(workers.prefill, ",")),
         absl::StrCat("--decode_workers=", absl::StrJoin(workers.decode, ",")), controller_flag}));
    TRIDENT_RETURN_IF_ERROR(
        WaitForRouterWorkers(state, *state.Find("router"), worker_ids, options.ready_timeout));
    TRIDENT_ASSIGN_OR_RETURN(ProcessRecord prometheus,
                             StartPrometheus(options, state, prometheus_port));
    state.processes.push_back(prometheus);
    return WriteState(options.state_dir, state);
  }();
  if (!status.ok()) {
    StopAll(state.processes, options.drain_timeout + absl::Seconds(2));
    std::error_code error;
    fs::remove(StatePath(options.state_dir), error);
    return status;
  }
  return state;
}

absl::Status UseClusterTls(const std::string& tls_dir) {
  if (tls_dir.empty()) return absl::OkStatus();
  TRIDENT_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                           TlsChannelCredentials({.cert_file = tls_dir + "/tls.crt",
                                                  .key_file = tls_dir + "/tls.key",
                                                  .ca_file = tls_dir + "/ca.crt"}));
  SetClusterChannelCredentials(std::move(credentials));
  return absl::OkStatus();
}

absl::StatusOr<ClusterState> LoadState(const std::string& state_dir) {
  std::ifstream in(StatePath(state_dir));
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("no cluster state in ", state_dir, " (start one with `trident up`)"));
  }
  const json parsed = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object() || !parsed.contains("processes") || !parsed["processes"].is_array()) {
    return absl::DataLossError(absl::StrCat(StatePath(state_dir), " is malformed"));
  }
  ClusterState state;
  state.host = parsed.value("host", "127.0.0.1");
  state.tls_dir = parsed.value("tls_dir", "");
  for (const json& p : parsed["processes"]) {
    state.processes.push_back({.name = p.value("name", ""),
                               .component = p.value("component", ""),
                               .pid = static_cast<pid_t>(p.value("pid", -1)),
                               .grpc_port = p.value("grpc_port", 0),
                               .metrics_port = p.value("metrics_port", 0),
                               .log_path = p.value("log", ""),
                               .role = p.value("role", ""),
                               .argv = p.value("argv", std::vector<std::string>())});
  }
  return state;
}

absl::StatusOr<ProcessRecord> RestartProcess(const std::string& state_dir,
                                             const std::string& name,
                                             absl::Duration ready_timeout) {
  TRIDENT_ASSIGN_OR_RETURN(ClusterState state, LoadState(state_dir));
  ProcessRecord* record = nullptr;
  for (ProcessRecord& p : state.processes) {
    if (p.name == name) record = &p;
  }
  if (record == nullptr) {
    return absl::NotFoundError(absl::StrCat("no process '", name, "' in the cluster of ",
                                            state_dir));
  }
  if (record->argv.empty() || record->component == "prometheus") {
    return absl::FailedPreconditionError(absl::StrCat(name, " cannot be restarted"));
  }
  if (IsRunning(record->pid)) {
    kill(record->pid, SIGKILL);
    (void)WaitForExit(record->pid, absl::Seconds(10));
  }
  TRIDENT_RETURN_IF_ERROR(SpawnService(state.host, ready_timeout, *record));
  const ProcessRecord restarted = *record;
  TRIDENT_RETURN_IF_ERROR(WriteState(state_dir, state));
  return restarted;
}

absl::Status Down(const std::string& state_dir, absl::Duration timeout) {
  TRIDENT_ASSIGN_OR_RETURN(const ClusterState state, LoadState(state_dir));
  StopAll(state.processes, timeout);
  std::error_code error;
  fs::remove(StatePath(state_dir), error);
  return absl::OkStatus();
}

}  // namespace trident::cli
