#include "services/attention/attention_server.h"

#include <unistd.h>

#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cpu/cpu_features.h"
#include "common/logging/log.h"
#include "common/numa/numa_arena.h"
#include "common/numa/numa_topology.h"
#include "common/status/status_macros.h"
#include "services/attention/attention_membership.h"
#include "services/attention/kv_store/arena_kv_pool.h"

namespace trident::attention {
namespace {

trident::v1::Isa IsaToProto(kernels::cpu::DecodeIsa isa) {
  switch (isa) {
    case kernels::cpu::DecodeIsa::kAvx2:
      return trident::v1::ISA_AVX2;
    case kernels::cpu::DecodeIsa::kAvx512Bf16:
      return trident::v1::ISA_AVX512_BF16;
    case kernels::cpu::DecodeIsa::kAmx:
      return trident::v1::ISA_AMX;
    case kernels::cpu::DecodeIsa::kAuto:
      break;
  }
  return trident::v1::ISA_UNSPECIFIED;
}

}  // namespace

absl::StatusOr<kernels::cpu::DecodeIsa> ParseIsa(absl::string_view text) {
  for (kernels::cpu::DecodeIsa isa :
       {kernels::cpu::DecodeIsa::kAuto, kernels::cpu::DecodeIsa::kAvx2,
        kernels::cpu::DecodeIsa::kAvx512Bf16, kernels::cpu::DecodeIsa::kAmx}) {
    if (text == kernels::cpu::DecodeIsaName(isa)) return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--attention_isa: expected auto, avx2, avx512_bf16 or amx, got '", text, "'"));
}

absl::StatusOr<std::unique_ptr<AttentionServer>> AttentionServer::Create(
    const AttentionServerOptions& options, prometheus::Registry* registry) {
  if (options.kv_budget_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the KV budget must be positive, got ", options.kv_budget_bytes, " bytes"));
  }
  if (options.blocks.capacity_bytes < 0 ||
      options.blocks.capacity_bytes > options.kv_budget_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the block store's capacity must be 0 to the KV budget (",
                     options.kv_budget_bytes, " bytes), got ", options.blocks.capacity_bytes));
  }
  if (options.lanes < 1) {
    return absl::InvalidArgumentError(absl::StrCat("lanes must be >= 1, got ", options.lanes));
  }
  auto server = std::unique_ptr<AttentionServer>(new AttentionServer(options));
  TRIDENT_RETURN_IF_ERROR(server->Start(registry));
  return server;
}

absl::Status AttentionServer::Start(prometheus::Registry* registry) {
  if (options_.service_id.empty()) options_.service_id = absl::StrCat("attention-", getpid());
  if (options_.incarnation == 0) {
    options_.incarnation = absl::Uniform<uint64_t>(absl::BitGen()) | 1;
  }
  clock_ = options_.clock != nullptr ? options_.clock : Clock::Real();
  TRIDENT_RETURN_IF_ERROR(StartKvMemory());
  store_ = std::make_unique<SequenceStore>(kv_pool_.get(), clock_, options_.store);
  blocks_ = std::make_unique<BlockStore>(kv_pool_.get(), clock_, options_.blocks);
  numa::SpinPool* pool = pool_.get();
  TRIDENT_ASSIGN_OR_RETURN(
      computer_, KvAttentionComputer::Create(
                     store_.get(),
                     Executor{.threads = pool->num_threads(),
                              .run = [pool](const std::function<void(int)>& fn) { pool->Run(fn); }},
                     options_.isa));
  computer_->set_block_store(blocks_.get());
  const std::string isa(kernels::cpu::DecodeIsaName(computer_->isa()));
  TRIDENT_ASSIGN_OR_RETURN(lanes_,
                           transport::UcxLanes::Create(ucx_.get(), {.lanes = options_.lanes}));
  metrics_ = std::make_unique<AttentionMetrics>(*registry, isa, numa_node_, pool->num_threads());
  transport::attention::UcxAttentionServerOptions data_plane_options;
  data_plane_options.on_request = [this](const transport::attention::AttentionRequestRecord& r) {
    metrics_->Record(r);
    absl::MutexLock lock(&stats_mu_);
    mean_request_time_ = mean_request_time_ == absl::ZeroDuration()
                             ? r.compute
                             : 0.9 * mean_request_time_ + 0.1 * r.compute;
  };
  TRIDENT_ASSIGN_OR_RETURN(
      data_plane_, transport::attention::UcxAttentionServer::Create(lanes_.get(), computer_.get(),
                                                                    std::move(data_plane_options)));
  AttentionServiceParts parts;
  parts.store = store_.get();
  parts.blocks = blocks_.get();
  parts.data_plane = data_plane_.get();
  parts.endpoint.set_owner_id(options_.service_id);
  parts.endpoint.set_incarnation(options_.incarnation);
  parts.endpoint.set_memory_type(trident::v1::MEMORY_TYPE_HOST);
  lanes_->DescribeAddresses(&parts.endpoint);
  parts.numa_node = numa_node_;
  parts.threads = pool->num_threads();
  parts.kv_region = kv_region_.get();
  parts.isa = IsaToProto(computer_->isa());
  parts.cpu_features = cpu::CpuFeatureNames(cpu::GetCpuFeatures());
  parts.data_plane_stats = [this] {
    DataPlaneStats stats;
    stats.requests = data_plane_->counters().requests;
    absl::MutexLock lock(&stats_mu_);
    stats.mean_request_time = mean_request_time_;
    return stats;
  };
  service_ = std::make_unique<AttentionService>(std::move(parts));
  TRIDENT_LOG(INFO) << "attention service " << options_.service_id << ": NUMA node " << numa_node_
                    << ", " << pool->num_threads() << " " << isa << " kernel threads on CPUs "
                    << absl::StrJoin(pool->threads(), ",") << ", KV budget "
                    << options_.kv_budget_bytes / (1 << 20) << " MiB (block store "
                    << options_.blocks.capacity_bytes / (1 << 20) << " MiB of it), " << options_.lanes
                    << " UCX lane(s) (" << options_.ucx_transports << ")";
  housekeeping_ = std::thread([this] { HousekeepingLoop(); });
  return absl::OkStatus();
}

absl::Status AttentionServer::StartKvMemory() {
  TRIDENT_ASSIGN_OR_RETURN(const numa::NumaTopology topology, numa::NumaTopology::Read());
  numa_node_ = options_.numa_node >= 0 ? options_.numa_node : topology.DefaultNode();
  TRIDENT_ASSIGN_OR_RETURN(
      pool_,
      numa::SpinPool::CreateOnNode(topology, numa_node_, options_.threads, options_.spin_window));
  TRIDENT_ASSIGN_OR_RETURN(
      std::unique_ptr<numa::NumaArena> arena,
      numa::NumaArena::Create(topology, {.node = numa_node_,
                                         .capacity_bytes = options_.kv_budget_bytes,
                                         .prefault_pool = pool_.get()}));
  void* base = arena->base();
  const size_t bytes = static_cast<size_t>(arena->capacity_bytes());
  kv_pool_ = std::make_unique<ArenaKvPool>(std::move(arena));
  TRIDENT_ASSIGN_OR_RETURN(
      ucx_, transport::UcxWorker::Create(transport::UcxOptions{
                .transports = options_.ucx_transports, .name = options_.service_id}));
  TRIDENT_ASSIGN_OR_RETURN(kv_region_, ucx_->Register(base, bytes, transport::MemoryKind::kHost));
  return absl::OkStatus();
}

AttentionServer::~AttentionServer() {
  LeaveController();
  stop_.Notify();
  if (housekeeping_.joinable()) housekeeping_.join();
  data_plane_.reset();
  service_.reset();
  store_.reset();
  kv_region_.reset();
}

std::vector<RegisteredService> AttentionServer::services() {
  return {{service_.get(), trident::v1::Attention::service_full_name()}};
}

absl::Status AttentionServer::JoinController(const controller_client::MemberAddresses& addresses) {
  if (options_.controller_address.empty() || member_ != nullptr) return absl::OkStatus();
  const AttentionFacts facts{.service_id = options_.service_id,
                             .incarnation = options_.incarnation,
                             .numa_node = numa_node_,
                             .isa = IsaToProto(computer_->isa()),
                             .threads = pool_->num_threads(),
                             .capacity_bytes = options_.kv_budget_bytes};
  controller_client::ControllerMemberOptions member;
  member.controller_address = options_.controller_address;
  member.build_registration = [facts, addresses] {
    return AttentionRegisterRequest(facts, addresses);
  };
  member.fill_heartbeat = [store = store_.get()](trident::v1::HeartbeatRequest* request) {
    FillAttentionHeartbeat(store->Stats(), request);
  };
  member.backoff = options_.controller_backoff;
  member.seed = options_.incarnation;
  TRIDENT_ASSIGN_OR_RETURN(member_, controller_client::ControllerMember::Create(std::move(member)));
  member_->Start();
  TRIDENT_LOG(INFO) << "joining the controller at " << options_.controller_address << " as "
                    << options_.service_id << " at " << addresses.address;
  return absl::OkStatus();
}

void AttentionServer::LeaveController() {
  if (member_ != nullptr) member_->Stop();
}

void AttentionServer::Housekeep() {
  data_plane_->ProbePeers(clock_->Now(), options_.peer_probe_timeout);
  for (const auto& [owner_id, incarnation] : data_plane_->TakeFailedPeers()) {
    store_->OwnerUnreachable(owner_id, incarnation);
  }
  store_->Sweep();
  blocks_->Sweep();
  metrics_->Sample(store_->Stats(), data_plane_->counters(), computer_->kv_bytes_read());
  metrics_->SampleBlocks(blocks_->Stats());
}

void AttentionServer::HousekeepingLoop() {
  while (!stop_.WaitForNotificationWithTimeout(options_.housekeeping_interval)) Housekeep();
}

}  // namespace trident::attention
