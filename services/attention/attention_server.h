// An attention service process's parts, wired together. main.cc fills
// AttentionServerOptions from its flags and serves services(); tests build
// one in process and serve it on port 0.
//
//   SpinPool               kernel threads pinned one per physical core of
//                          the node, spinning between layers
//   KvPool                 the KV budget: a NUMA-bound arena on the node,
//                          pre-faulted by those threads, registered with UCX
//   SequenceStore          sessions, sequences, grace, idle timeouts
//   KvAttentionComputer    append + decode attention, on the kernel threads
//   UcxWorker, UcxLanes    the data plane's workers
//   UcxAttentionServer     per-layer requests in, o out
//   AttentionService       the gRPC control plane
//   housekeeping thread    every housekeeping_interval: owners whose UCX
//                          endpoints failed become unreachable (their grace
//                          starts), expired sessions and idle sequences are
//                          freed, metrics are sampled; owners are probed
//                          (an unanswered probe counts as a failure)
//   ControllerMember       with a controller address, once serving
//                          (JoinController): registration and heartbeats
//                          carrying the store's load
//
// Destroyed in reverse: the controller membership ends first, then the
// housekeeping thread stops, then the data plane (no request runs after),
// then the store frees what is left.

#ifndef TRIDENT_SERVICES_ATTENTION_ATTENTION_SERVER_H_
#define TRIDENT_SERVICES_ATTENTION_ATTENTION_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/controller_client/backoff.h"
#include "common/controller_client/controller_member.h"
#include "common/controller_client/member_address.h"
#include "common/grpc/server.h"
#include "common/numa/spin_pool.h"
#include "common/time/clock.h"
#include "common/transport/attention/ucx_attention_server.h"
#include "common/transport/ucx_lanes.h"
#include "common/transport/ucx_worker.h"
#include "kernels/cpu/decode_attention/decode_attention.h"
#include "prometheus/registry.h"
#include "services/attention/attention_metrics.h"
#include "services/attention/attention_service.h"
#include "services/attention/kv_attention_computer.h"
#include "services/attention/kv_store/kv_pool.h"
#include "services/attention/kv_store/block_store.h"
#include "services/attention/kv_store/sequence_store.h"

namespace trident::attention {

struct AttentionServerOptions {
  // Reported in stats and endpoints; empty: "attention-<pid>".
  std::string service_id;
  // This process's incarnation; 0: a random odd number.
  uint64_t incarnation = 0;
  // The NUMA node whose memory holds the KV and whose cores compute; -1:
  // the node of the process's first allowed CPU. (main.cc also binds the
  // process to it.)
  int32_t numa_node = -1;
  // Kernel threads, each pinned to one physical core of the node; 0: one
  // per physical core the affinity mask allows there.
  int32_t threads = 0;
  // The kernel's instruction set (kAuto: the best this CPU has).
  kernels::cpu::DecodeIsa isa = kernels::cpu::DecodeIsa::kAuto;
  // How long idle kernel threads spin for the next layer before they sleep.
  absl::Duration spin_window = absl::Milliseconds(5);
  // DRAM for sequences' KV.
  int64_t kv_budget_bytes = int64_t{1} << 30;
  // UCX_TLS of the data plane's workers; empty: UCX's default.
  std::string ucx_transports = "^sysv";
  // Data-plane lanes (UcxLanes).
  int32_t lanes = 1;
  SequenceStoreOptions store;
  // The KV block store (the DRAM tier of the prefix cache); its blocks come
  // from the same KV budget as sequences. capacity_bytes 0: off.
  BlockStoreOptions blocks;
  absl::Duration housekeeping_interval = absl::Milliseconds(250);
  // An owner that has not answered a liveness probe for this long counts as
  // unreachable (its grace starts).
  absl::Duration peer_probe_timeout = absl::Seconds(3);
  // Time for the store; null: the real clock.
  Clock* clock = nullptr;
  // host:port of the controller (trident.v1.Controller) to register with
  // and heartbeat to once serving (JoinController); empty: none.
  std::string controller_address;
  // Retry bounds of the controller client.
  controller_client::BackoffOptions controller_backoff;
};

// "auto", "avx2", "avx512_bf16" or "amx"; INVALID_ARGUMENT naming
// --attention_isa otherwise.
absl::StatusOr<kernels::cpu::DecodeIsa> ParseIsa(absl::string_view text);

class AttentionServer {
 public:
  // Builds every part and starts the data plane and housekeeping. Errors of
  // UcxWorker::Create and the pool's allocation, INVALID_ARGUMENT for a
  // non-positive budget or lane count.
  static absl::StatusOr<std::unique_ptr<AttentionServer>> Create(
      const AttentionServerOptions& options, prometheus::Registry* registry);
  ~AttentionServer();

  AttentionServer(const AttentionServer&) = delete;
  AttentionServer& operator=(const AttentionServer&) = delete;

  std::vector<RegisteredService> services();
  AttentionService& service() { return *service_; }
  SequenceStore& store() { return *store_; }
  BlockStore& blocks() { return *blocks_; }
  // The node, and the CPU each kernel thread is pinned to.
  int32_t numa_node() const { return numa_node_; }
  const std::vector<int>& kernel_cpus() const { return pool_->threads(); }

  // One housekeeping pass, as the thread runs it.
  void Housekeep();

  // With options.controller_address: registers with the controller as
  // reached at `addresses` (the gRPC server now serving services()), then
  // heartbeats the store's load (held and capacity bytes, sequences) until
  // LeaveController; retries in the background while the controller is
  // unreachable. Without a controller address, does nothing. Errors:
  // INVALID_ARGUMENT from ControllerMember::Create. Call once.
  absl::Status JoinController(const controller_client::MemberAddresses& addresses);

  // Deregisters (bounded by a short deadline) and stops heartbeating;
  // nothing if not joined. Idempotent.
  void LeaveController();

  // Null unless joined.
  const controller_client::ControllerMember* ControllerMemberForTesting() const {
    return member_.get();
  }

 private:
  explicit AttentionServer(AttentionServerOptions options) : options_(std::move(options)) {}
  absl::Status Start(prometheus::Registry* registry);
  // The node, the kernel threads, the arena and its UCX registration.
  absl::Status StartKvMemory();
  void HousekeepingLoop();

  AttentionServerOptions options_;
  Clock* clock_ = nullptr;
  int32_t numa_node_ = 0;
  std::unique_ptr<numa::SpinPool> pool_;
  std::unique_ptr<KvPool> kv_pool_;
  std::unique_ptr<transport::MemoryRegion> kv_region_;
  // Before the sequence store: sequences reading blocks in place return
  // their borrows to it when the sequence store is destroyed.
  std::unique_ptr<BlockStore> blocks_;
  std::unique_ptr<SequenceStore> store_;
  std::unique_ptr<KvAttentionComputer> computer_;
  std::unique_ptr<transport::UcxWorker> ucx_;
  std::unique_ptr<transport::UcxLanes> lanes_;
  std::unique_ptr<AttentionMetrics> metrics_;
  std::unique_ptr<transport::attention::UcxAttentionServer> data_plane_;
  std::unique_ptr<AttentionService> service_;
  // Mean request time, exponentially weighted; written by the dispatcher.
  absl::Mutex stats_mu_;
  absl::Duration mean_request_time_ ABSL_GUARDED_BY(stats_mu_);
  absl::Notification stop_;
  std::thread housekeeping_;
  // Last: its thread reads the store, so it goes first.
  std::unique_ptr<controller_client::ControllerMember> member_;
};

}  // namespace trident::attention

#endif  // TRIDENT_SERVICES_ATTENTION_ATTENTION_SERVER_H_
