// The CPU attention service: holds offloaded sequences' KV in the DRAM of
// one NUMA node and computes their decode attention. Flags only; the parts
// are in attention_server.h.

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/controller_client/member_address.h"
#include "common/logging/log.h"
#include "common/numa/numa_binding.h"
#include "common/numa/numa_topology.h"
#include "common/service/service_runtime.h"
#include "common/status/status_macros.h"
#include "services/attention/attention_server.h"

ABSL_FLAG(int, numa_node, -1,
          "NUMA node whose cores and memory this process uses; -1: the node of its first "
          "allowed CPU.");
ABSL_FLAG(std::string, service_id, "",
          "Id of this service in stats and endpoints; empty: attention-<pid>.");
ABSL_FLAG(int64_t, kv_budget_mb, 1024,
          "DRAM for offloaded sequences' KV, in MiB; admission beyond it is RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, kv_store_mb, 0,
          "MiB of the KV budget (--kv_budget_mb) the KV block store may hold: the DRAM tier of "
          "the cluster's prefix cache, which workers started with --kv_tier write cached "
          "blocks to and fetch them from. 0 turns the store off.");
ABSL_FLAG(absl::Duration, kv_store_lease, absl::Seconds(30),
          "How long a worker's block-store put reservation or fetch pin lasts unreleased.");
ABSL_FLAG(std::string, ucx_transports, "^sysv",
          "UCX_TLS for the attention data plane (e.g. 'tcp', 'posix', 'rc_x'); empty: UCX's "
          "default.");
ABSL_FLAG(int32_t, lanes, 1, "UCX workers (each with a progress thread) taking requests.");
ABSL_FLAG(absl::Duration, reconnect_grace, absl::Seconds(10),
          "How long an unreachable decode worker's sequences are kept for it to reconnect.");
ABSL_FLAG(int32_t, threads, 0,
          "Attention kernel threads, each pinned to one physical core of the node; 0: every "
          "physical core the affinity mask allows there.");
ABSL_FLAG(std::string, attention_isa, "auto",
          "Instruction set of the attention kernel: auto (the best this CPU has), avx2, "
          "avx512_bf16 or amx; one the CPU lacks fails start-up.");
ABSL_FLAG(absl::Duration, spin_window, absl::Milliseconds(5),
          "How long idle kernel threads spin for the next layer before sleeping.");
ABSL_FLAG(absl::Duration, peer_probe_timeout, absl::Seconds(3),
          "A decode worker that has not answered a liveness probe for this long counts as "
          "unreachable (its --reconnect_grace starts).");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port this service registers with the controller (decode workers reach it "
          "there; its host also names the /metrics endpoint); empty: --host (or, when that is "
          "a wildcard, the host name) with the bound ports.");
ABSL_FLAG(std::string, controller_address, "",
          "host:port of the controller: once serving, the service registers there (id, "
          "incarnation, --advertise_address, NUMA node, ISA, threads, KV budget; node name from "
          "$NODE_NAME, else the host name) and heartbeats its load, re-registering when the "
          "controller restarts, and deregisters on shutdown. Empty: no controller.");
ABSL_FLAG(absl::Duration, default_idle_timeout, absl::Minutes(10),
          "A sequence no request names for this long is freed (when its admission set none).");

int main(int argc, char** argv) {
  return trident::RunServiceMain(
      argc, argv, {.component = "attention", .grpc_port = 50053, .metrics_port = 9403},
      [](trident::ServiceRuntime& runtime) -> absl::Status {
        const int numa_node = absl::GetFlag(FLAGS_numa_node);
        if (numa_node < -1) {
          return absl::InvalidArgumentError(
              absl::StrCat("--numa_node: must be -1 or a node number, got ", numa_node));
        }
        // Memory policy and affinity first: the threads started from here on
        // (UCX's, the kernel pool's) inherit them.
        TRIDENT_ASSIGN_OR_RETURN(const trident::numa::NumaTopology topology,
                                 trident::numa::NumaTopology::Read());
        const int node = numa_node >= 0 ? numa_node : topology.DefaultNode();
        TRIDENT_RETURN_IF_ERROR(trident::numa::BindProcessToNode(topology, node));
        trident::attention::AttentionServerOptions options;
        options.service_id = absl::GetFlag(FLAGS_service_id);
        options.numa_node = node;
        options.threads = absl::GetFlag(FLAGS_threads);
        options.spin_window = absl::GetFlag(FLAGS_spin_window);
        TRIDENT_ASSIGN_OR_RETURN(options.isa,
                                 trident::attention::ParseIsa(absl::GetFlag(FLAGS_attention_isa)));
        options.kv_budget_bytes = absl::GetFlag(FLAGS_kv_budget_mb) << 20;
        options.blocks.capacity_bytes = absl::GetFlag(FLAGS_kv_store_mb) << 20;
        options.blocks.put_lease = absl::GetFlag(FLAGS_kv_store_lease);
        options.blocks.read_lease = absl::GetFlag(FLAGS_kv_store_lease);
        options.ucx_transports = absl::GetFlag(FLAGS_ucx_transports);
        options.lanes = absl::GetFlag(FLAGS_lanes);
        options.store.reconnect_grace = absl::GetFlag(FLAGS_reconnect_grace);
        options.peer_probe_timeout = absl::GetFlag(FLAGS_peer_probe_timeout);
        options.store.default_idle_timeout = absl::GetFlag(FLAGS_default_idle_timeout);
        options.controller_address = absl::GetFlag(FLAGS_controller_address);
        TRIDENT_ASSIGN_OR_RETURN(
            auto server, trident::attention::AttentionServer::Create(options, &runtime.registry()));
        trident::ServeHooks hooks;
        hooks.on_serving = [&server](const trident::ServingPorts& ports) {
          const absl::Status joined =
              server->JoinController(trident::controller_client::AdvertisedAddresses(
                  absl::GetFlag(FLAGS_advertise_address), ports.host, ports.grpc_port,
                  ports.metrics_port));
          if (!joined.ok()) TRIDENT_LOG(ERROR) << "not joining the controller: " << joined;
        };
        hooks.on_drain = [&server] { server->LeaveController(); };
        return runtime.Serve(server->services(), hooks);
      });
}
