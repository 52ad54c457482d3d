#include "tools/cli/cluster_status.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "grpcpp/grpcpp.h"
#include "trident/v1/attention.grpc.pb.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/grpc/health_client.h"
#include "common/http/http_client.h"
#include "common/process/subprocess.h"

namespace trident::cli {
namespace {

std::string WorkerRow(const ProcessStatus& s) {
  if (!s.load.has_value()) {
    const std::string why = s.running ? s.load_error : "not running";
    return absl::StrFormat("%-12s %-16s %s\n", s.record.name, s.record.role + "?",
                           "load unknown: " + why);
  }
  const WorkerLoadSummary& load = *s.load;
  const std::string role =
      load.pending_role.empty() ? load.role : absl::StrCat(load.role, "->", load.pending_role);
  return absl::StrFormat("%-12s %-16s %-10s %7d %7d %8.1f%% %9d\n", s.record.name, role,
                         load.state, load.running_sequences, load.waiting_sequences,
                         100 * load.kv_cache_usage_ratio, load.cpu_attention_sequences);
}

std::string AttentionRow(const ProcessStatus& s) {
  if (!s.attention.has_value()) {
    return absl::StrFormat("%-12s %s\n", s.record.name,
                           s.running ? "stats unknown" : "not running");
  }
  const trident::v1::AttentionStats& a = *s.attention;
  const std::string isa_name = trident::v1::Isa_Name(a.isa());
  absl::string_view isa = isa_name;
  absl::ConsumePrefix(&isa, "ISA_");
  return absl::StrFormat("%-12s %4d %-12s %7d %9d %10lld %9.1f/%-7.1f %8d %10lld\n",
                         s.record.name, a.numa_node(), absl::AsciiStrToLower(std::string(isa)), a.threads(),
                         a.sequences(), static_cast<long long>(a.held_tokens()),
                         a.held_bytes() / 1048576.0, a.capacity_bytes() / 1048576.0, a.sessions(),
                         static_cast<long long>(a.attention_requests_total()));
}

std::optional<trident::v1::AttentionStats> ReadAttentionStats(const std::string& address) {
  auto stub = trident::v1::Attention::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  trident::v1::AttentionStats stats;
  if (!stub->GetStats(&context, trident::v1::GetAttentionStatsRequest(), &stats).ok()) {
    return std::nullopt;
  }
  return stats;
}

}  // namespace

std::vector<ProcessStatus> CheckStatus(const ClusterState& state) {
  std::vector<ProcessStatus> statuses;
  for (const ProcessRecord& record : state.processes) {
    ProcessStatus status{.record = record, .running = IsRunning(record.pid)};
    if (!status.running) {
      status.health = "DOWN";
    } else if (record.component == "prometheus") {
      absl::StatusOr<http::HttpResponse> response =
          http::Get(absl::StrCat(state.PrometheusUrl(), "/-/ready"), absl::Seconds(2));
      status.health = response.ok() && response->status_code == 200 ? "SERVING" : "NOT_READY";
    } else {
      absl::StatusOr<ServingStatus> health =
          CheckHealth(record.GrpcAddress(state.host), "", absl::Seconds(2));
      status.health = health.ok() ? std::string(ServingStatusName(*health))
                                  : std::string(absl::StatusCodeToString(health.status().code()));
    }
    if (status.running && record.component == "attention") {
      status.attention = ReadAttentionStats(record.GrpcAddress(state.host));
    }
    if (status.running && record.component == "worker") {
      absl::StatusOr<WorkerLoadSummary> load = ReadWorkerLoad(record.GrpcAddress(state.host));
      if (load.ok()) {
        status.load = *load;
      } else {
        status.load_error = load.status().ToString();
      }
    }
    statuses.push_back(status);
  }
  return statuses;
}

bool AllServing(const std::vector<ProcessStatus>& statuses) {
  for (const ProcessStatus& s : statuses) {
    if (!s.running || s.health != "SERVING") return false;
  }
  return !statuses.empty();
}

std::string FormatStatus(const ClusterState& state, const std::vector<ProcessStatus>& statuses) {
  std::string out =
      absl::StrFormat("%-12s %-8s %-22s %-38s %s\n", "PROCESS", "PID", "GRPC", "METRICS", "HEALTH");
  std::string workers;
  std::string attention;
  for (const ProcessStatus& s : statuses) {
    const ProcessRecord& r = s.record;
    const std::string grpc = r.grpc_port > 0 ? r.GrpcAddress(state.host) : "-";
    const std::string metrics = absl::StrCat("http://", state.host, ":", r.metrics_port,
                                             r.component == "prometheus" ? "" : "/metrics");
    absl::StrAppendFormat(&out, "%-12s %-8d %-22s %-38s %s\n", r.name, static_cast<int>(r.pid),
                          grpc, metrics, s.health);
    if (r.component == "worker") workers += WorkerRow(s);
    if (r.component == "attention") attention += AttentionRow(s);
  }
  if (!workers.empty()) {
    absl::StrAppendFormat(&out, "\n%-12s %-16s %-10s %7s %7s %9s %9s\n", "WORKER", "ROLE",
                          "STATE", "RUNNING", "WAITING", "KV CACHE", "ON CPU");
    out += workers;
  }
  if (!attention.empty()) {
    absl::StrAppendFormat(&out, "\n%-12s %4s %-12s %7s %9s %10s %17s %8s %10s\n", "ATTENTION",
                          "NODE", "ISA", "THREADS", "SEQUENCES", "TOKENS", "KV MiB/BUDGET",
                          "SESSIONS", "REQUESTS");
    out += attention;
  }
  return out;
}

}  // namespace trident::cli
