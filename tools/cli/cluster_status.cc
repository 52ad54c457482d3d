#include "tools/cli/cluster_status.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/grpc/health_client.h"
#include "common/grpc/status.h"
#include "common/grpc/tls.h"
#include "common/http/http_client.h"
#include "common/process/subprocess.h"
#include "common/time/proto_time.h"
#include "grpcpp/grpcpp.h"
#include "trident/v1/attention.grpc.pb.h"
#include "trident/v1/controller.grpc.pb.h"

namespace trident::cli {
namespace {

// A proto enum value's name without `prefix`, lower case: "serving",
// "decode", "amx".
std::string ShortName(const std::string& full, absl::string_view prefix) {
  absl::string_view view = full;
  absl::ConsumePrefix(&view, prefix);
  return absl::AsciiStrToLower(std::string(view));
}

// The prefix cache's hit rate since the worker started: prompt tokens found
// cached over prompt tokens looked up ("12.5%"); "-" before any lookup.
std::string PrefixHitText(const std::optional<trident::v1::KvStats>& kv) {
  if (!kv.has_value() || kv->prefix_cache_queries_total() <= 0) return "-";
  return absl::StrFormat("%.1f%%", 100.0 * static_cast<double>(kv->prefix_cache_hits_total()) /
                                       static_cast<double>(kv->prefix_cache_queries_total()));
}

std::string WorkerRow(const ProcessStatus& s) {
  if (!s.load.has_value()) {
    const std::string why = s.running ? s.load_error : "not running";
    return absl::StrFormat("%-12s %-16s %s\n", s.record.name, s.record.role + "?",
                           "load unknown: " + why);
  }
  const WorkerLoadSummary& load = *s.load;
  const std::string role =
      load.pending_role.empty() ? load.role : absl::StrCat(load.role, "->", load.pending_role);
  const std::string cached =
      s.kv_stats.has_value() ? absl::StrCat(s.kv_stats->blocks_cached()) : std::string("-");
  return absl::StrFormat("%-12s %-16s %-10s %7d %7d %8.1f%% %9d %10s %7s\n", s.record.name, role,
                         load.state, load.running_sequences, load.waiting_sequences,
                         100 * load.kv_cache_usage_ratio, load.cpu_attention_sequences,
                         PrefixHitText(s.kv_stats), cached);
}

std::string AttentionRow(const ProcessStatus& s) {
  if (!s.attention.has_value()) {
    return absl::StrFormat("%-12s %s\n", s.record.name,
                           s.running ? "stats unknown" : "not running");
  }
  const trident::v1::AttentionStats& a = *s.attention;
  return absl::StrFormat("%-12s %4d %-12s %7d %9d %10lld %9.1f/%-7.1f %8d %10lld\n", s.record.name,
                         a.numa_node(), ShortName(trident::v1::Isa_Name(a.isa()), "ISA_"),
                         a.threads(), a.sequences(), static_cast<long long>(a.held_tokens()),
                         a.held_bytes() / 1048576.0, a.capacity_bytes() / 1048576.0, a.sessions(),
                         static_cast<long long>(a.attention_requests_total()));
}

// An attention service's block store (the prefix cache's DRAM tier):
// blocks, MiB held of its budget, blocks its lookups matched of lookups.
// Nothing for a service whose stats are unknown (its ATTENTION row says so).
std::string BlockStoreRow(const ProcessStatus& s) {
  if (!s.attention.has_value()) return "";
  const trident::v1::BlockStoreStats& b = s.attention->block_store();
  if (b.capacity_bytes() <= 0) return absl::StrFormat("%-12s %s\n", s.record.name, "off");
  return absl::StrFormat(
      "%-12s %8lld %17s %19s\n", s.record.name, static_cast<long long>(b.blocks()),
      absl::StrFormat("%.1f/%.1f", b.bytes() / 1048576.0, b.capacity_bytes() / 1048576.0),
      absl::StrCat(b.blocks_matched_total(), "/", b.lookups_total()));
}

std::optional<trident::v1::AttentionStats> ReadAttentionStats(const std::string& address) {
  auto stub = trident::v1::Attention::NewStub(CreateClusterChannel(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  trident::v1::AttentionStats stats;
  if (!stub->GetStats(&context, trident::v1::GetAttentionStatsRequest(), &stats).ok()) {
    return std::nullopt;
  }
  return stats;
}

std::string StateName(trident::v1::ServingState state) {
  return ShortName(trident::v1::ServingState_Name(state), "SERVING_STATE_");
}

std::string RoleText(trident::v1::Role role) {
  return ShortName(trident::v1::Role_Name(role), "ROLE_");
}

std::string PressureText(absl::string_view role, const trident::v1::RolePressure& p) {
  return absl::StrFormat("%s %.2f (forecast %.2f, %s, %d worker%s)", role, p.observed(),
                         p.forecast(), p.dominant().empty() ? "-" : p.dominant(), p.workers(),
                         p.workers() == 1 ? "" : "s");
}

// The controller's section: members, pressure, last decision.
std::string ControllerSection(const ProcessStatus& s) {
  std::string out = "\nCONTROLLER\n";
  if (!s.controller.has_value()) {
    return absl::StrCat(out, "  status unknown: ",
                        s.running ? s.controller_error : std::string("not running"), "\n");
  }
  const trident::v1::ControllerStatus& c = *s.controller;
  absl::StrAppendFormat(
      &out, "  incarnation %d, decisions every %s from %s, %d flip%s%s\n",
      c.controller_incarnation(), absl::FormatDuration(DurationFromProto(c.decision_interval())),
      c.prometheus_url().empty() ? "no Prometheus" : c.prometheus_url(), c.flips_total(),
      c.flips_total() == 1 ? "" : "s",
      c.pending_flip_worker_id().empty() ? ""
                                         : absl::StrCat(", flipping ", c.pending_flip_worker_id()));
  if (s.topology.has_value()) {
    for (const trident::v1::WorkerEntry& w : s.topology->workers()) {
      absl::StrAppendFormat(
          &out, "  member %-12s %-16s %s\n", w.registration().worker_id(),
          w.pending_role() == trident::v1::ROLE_UNSPECIFIED
              ? RoleText(w.role())
              : absl::StrCat(RoleText(w.role()), "->", RoleText(w.pending_role())),
          StateName(w.state()));
    }
    for (const trident::v1::AttentionServiceEntry& a : s.topology->attention_services()) {
      absl::StrAppendFormat(&out, "  member %-12s %-16s %s\n", a.registration().service_id(),
                            "attention", StateName(a.state()));
    }
  }
  if (c.decisions_size() == 0) return absl::StrCat(out, "  no decision yet\n");
  const trident::v1::RoleDecision& d = c.decisions(0);
  absl::StrAppendFormat(&out, "  pressure %s; %s\n", PressureText("prefill", d.prefill()),
                        PressureText("decode", d.decode()));
  absl::StrAppendFormat(
      &out, "  last decision at %s: %s (%s): %s\n",
      absl::FormatTime("%H:%M:%S", TimeFromProto(d.time()), absl::LocalTimeZone()),
      d.flip() ? absl::StrCat("flip ", d.worker_id(), " ", RoleText(d.from_role()), "->",
                              RoleText(d.to_role()))
               : std::string("hold"),
      d.reason(), d.detail());
  return out;
}

}  // namespace

absl::StatusOr<ControllerView> ReadController(const std::string& address, int32_t max_decisions,
                                              absl::Duration timeout) {
  auto stub = trident::v1::Controller::NewStub(CreateClusterChannel(address));
  ControllerView view;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  trident::v1::GetControllerStatusRequest request;
  request.set_max_decisions(max_decisions);
  if (absl::Status s = FromGrpcStatus(stub->GetStatus(&context, request, &view.status)); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("GetStatus: ", s.message()));
  }
  grpc::ClientContext topology_context;
  topology_context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (absl::Status s = FromGrpcStatus(
          stub->GetTopology(&topology_context, trident::v1::GetTopologyRequest(), &view.topology));
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("GetTopology: ", s.message()));
  }
  return view;
}

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
    if (status.running && record.component == "controller") {
      absl::StatusOr<ControllerView> view =
          ReadController(record.GrpcAddress(state.host), /*max_decisions=*/1);
      if (view.ok()) {
        status.controller = std::move(view->status);
        status.topology = std::move(view->topology);
      } else {
        status.controller_error = std::string(view.status().message());
      }
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
      absl::StatusOr<trident::v1::KvStats> kv = ReadWorkerKvStats(record.GrpcAddress(state.host));
      if (kv.ok()) status.kv_stats = *std::move(kv);
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
  std::string block_stores;
  std::string controller;
  for (const ProcessStatus& s : statuses) {
    const ProcessRecord& r = s.record;
    const std::string grpc = r.grpc_port > 0 ? r.GrpcAddress(state.host) : "-";
    const std::string metrics = absl::StrCat("http://", state.host, ":", r.metrics_port,
                                             r.component == "prometheus" ? "" : "/metrics");
    absl::StrAppendFormat(&out, "%-12s %-8d %-22s %-38s %s\n", r.name, static_cast<int>(r.pid),
                          grpc, metrics, s.health);
    if (r.component == "worker") workers += WorkerRow(s);
    if (r.component == "attention") {
      attention += AttentionRow(s);
      block_stores += BlockStoreRow(s);
    }
    if (r.component == "controller") controller += ControllerSection(s);
  }
  if (!workers.empty()) {
    absl::StrAppendFormat(&out, "\n%-12s %-16s %-10s %7s %7s %9s %9s %10s %7s\n", "WORKER", "ROLE",
                          "STATE", "RUNNING", "WAITING", "KV CACHE", "ON CPU", "PREFIX HIT",
                          "CACHED");
    out += workers;
  }
  if (!attention.empty()) {
    absl::StrAppendFormat(&out, "\n%-12s %4s %-12s %7s %9s %10s %17s %8s %10s\n", "ATTENTION",
                          "NODE", "ISA", "THREADS", "SEQUENCES", "TOKENS", "KV MiB/BUDGET",
                          "SESSIONS", "REQUESTS");
    out += attention;
  }
  if (!block_stores.empty()) {
    absl::StrAppendFormat(&out, "\n%-12s %8s %17s %19s\n", "BLOCK STORE", "BLOCKS", "MiB/BUDGET",
                          "HIT BLOCKS/LOOKUPS");
    out += block_stores;
  }
  return out + controller;
}

}  // namespace trident::cli
