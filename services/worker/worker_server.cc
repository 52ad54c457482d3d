#include "services/worker/worker_server.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging/log.h"
#include "common/status/error_details.h"
#include "common/status/status_macros.h"
#include "services/worker/worker_membership.h"

namespace trident::worker {
namespace {

namespace v1 = ::trident::v1;

// How often the KV tier's view of its store's events is brought up to date.
constexpr absl::Duration kKvTierEventsInterval = absl::Milliseconds(200);

Device DeviceOf(const WorkerModelOptions& model) {
  return model.cuda_device < 0 ? Device{} : Device{Device::Kind::kCuda, model.cuda_device};
}

WorkerIdentity IdentityFor(const WorkerServerOptions& options) {
  WorkerIdentity identity;
  identity.worker_id =
      options.worker_id.empty() ? absl::StrCat("worker-", getpid()) : options.worker_id;
  identity.incarnation = options.incarnation != 0 ? options.incarnation
                                                  : (absl::Uniform<uint64_t>(absl::BitGen()) | 1);
  identity.role = options.role;
  return identity;
}

bool WantsUcx(const WorkerServerOptions& options) {
  switch (options.kv_transport) {
    case KvTransportKind::kUcx:
      return true;
    case KvTransportKind::kNone:
      return false;
    case KvTransportKind::kAuto:
      return options.role != v1::ROLE_BOTH;
  }
  return false;
}

void LogKvTransport(const transport::UcxOptions& ucx, const backend::KvMemory& memory,
                    const transport::UcxKv& kv, uint64_t staging_bytes, int lanes) {
  TRIDENT_LOG(INFO) << "KV transport: UCX"
                    << (ucx.transports.empty() ? std::string()
                                               : absl::StrCat(" over ", ucx.transports))
                    << ", " << memory.bytes / (1 << 20) << " MiB of KV "
                    << (kv.staged()
                            ? absl::StrCat("in device memory, staged through ", staging_bytes >> 20,
                                           " MiB of pinned host memory (UCX has no "
                                           "CUDA support)")
                            : std::string("registered"))
                    << ", " << lanes << " message lane" << (lanes == 1 ? "" : "s");
}

}  // namespace

absl::StatusOr<KvTransportKind> ParseKvTransport(absl::string_view text) {
  if (text == "auto") return KvTransportKind::kAuto;
  if (text == "ucx") return KvTransportKind::kUcx;
  if (text == "none") return KvTransportKind::kNone;
  return InvalidArgumentForField(
      "--kv_transport", absl::StrCat("expected 'ucx', 'none' or 'auto', got '", text, "'"));
}

WorkerServer::WorkerServer(WorkerServerOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &own_clock_),
      identity_(IdentityFor(options_)) {}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Create(WorkerServerOptions options,
                                                                   prometheus::Registry* registry) {
  std::unique_ptr<WorkerServer> server(new WorkerServer(std::move(options)));
  TRIDENT_LOG(INFO) << "worker " << server->identity_.worker_id << " on "
                    << DeviceOf(server->options_.model).ToString() << ", role "
                    << v1::Role_Name(server->options_.role);
  TRIDENT_RETURN_IF_ERROR(server->LoadModel(registry));
  TRIDENT_RETURN_IF_ERROR(server->StartKvTransport());
  TRIDENT_RETURN_IF_ERROR(server->StartOffload());
  server->BuildServices(registry);
  server->StartLoadReports();
  return server;
}

WorkerServer::~WorkerServer() {
  LeaveController();
  if (model_ != nullptr) {
    model_->engine->Shutdown();
    model_->engine->SetStepHook(nullptr);
  }
  // While the services whose callbacks they hold still live: requests the
  // tier still prepares end now (the engine refuses them).
  kv_tier_sampler_.reset();
  kv_tier_events_poller_.reset();
  kv_tier_.reset();
}

absl::Status WorkerServer::LoadModel(prometheus::Registry* registry) {
  if (options_.model.model_dir.empty()) {
    TRIDENT_LOG(WARNING) << "no model given: this worker serves no generations";
    return absl::OkStatus();
  }
  TRIDENT_ASSIGN_OR_RETURN(model_, LoadWorkerModel(options_.model, registry));
  // The reservations' blocks come out of the engine's pool.
  blocks_ = std::make_unique<EngineBlockSource>(model_->engine.get());
  reservations_ = std::make_unique<KvReservations>(
      blocks_.get(), clock_, KvReservationOptions{.block_size = options_.model.kv_block_size});
  return absl::OkStatus();
}

absl::Status WorkerServer::StartKvTransport() {
  if (model_ == nullptr) return absl::OkStatus();
  transport::UcxOptions ucx_options;
  ucx_options.transports = options_.ucx_transports;
  ucx_options.name = identity_.worker_id;
  if (WantsUcx(options_) || !options_.attention_services.empty()) {
    TRIDENT_ASSIGN_OR_RETURN(ucx_, transport::UcxWorker::Create(ucx_options));
  }
  if (!WantsUcx(options_)) return absl::OkStatus();
  TRIDENT_ASSIGN_OR_RETURN(const backend::KvMemory memory, model_->engine->backend().kv_memory());
  transport::UcxKvOptions kv_options;
  kv_options.sink = reservations_.get();
  kv_options.receive_threads = options_.kv_receive_threads;
  kv_options.receive_fetches = options_.kv_receive_fetches;
  kv_options.lanes = options_.kv_lanes != 0 ? options_.kv_lanes : (memory.device ? 2 : 1);
  const int lanes = kv_options.lanes;
  // A tensor-parallel backend's ranks, seen as one pool: reached only
  // through its copier.
  kv_options.force_staging = memory.view;
  if (memory.device) {
    // Stages the pool when UCX cannot register it, and copies KV messages
    // (tcp, shared memory) into it either way.
    TRIDENT_ASSIGN_OR_RETURN(kv_options.copier, model_->engine->backend().CreateKvCopier());
    kv_options.staging_bytes = options_.kv_staging_bytes;
    kv_options.staging_slot_bytes =
        std::min<uint64_t>(kv_options.staging_slot_bytes, kv_options.staging_bytes);
  }
  TRIDENT_ASSIGN_OR_RETURN(
      kv_, transport::UcxKv::Create(ucx_.get(), memory, identity_.worker_id, identity_.incarnation,
                                    std::move(kv_options)));
  LogKvTransport(ucx_options, memory, *kv_, options_.kv_staging_bytes, lanes);
  if (!memory.device || !options_.kv_peer_lane) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<backend::KvPeerLane>> lane =
      model_->engine->backend().CreateKvPeerLane();
  absl::StatusOr<std::unique_ptr<transport::PeerLaneKv>> peer_kv =
      lane.ok() ? transport::PeerLaneKv::Create(kv_.get(), kv_.get(), memory.spec, *std::move(lane))
                : absl::StatusOr<std::unique_ptr<transport::PeerLaneKv>>(lane.status());
  if (!peer_kv.ok()) {
    TRIDENT_LOG(WARNING) << "KV goes over UCX only: no GPU-to-GPU lane: " << peer_kv.status();
    return absl::OkStatus();
  }
  peer_kv_ = *std::move(peer_kv);
  TRIDENT_LOG(INFO) << "KV transport: GPU to GPU (cuda_ipc) to decode workers on this host ("
                    << peer_kv_->host_id() << "), UCX to the others";
  return absl::OkStatus();
}

absl::Status WorkerServer::StartOffload() {
  if (model_ == nullptr || options_.attention_services.empty()) return absl::OkStatus();
  TRIDENT_ASSIGN_OR_RETURN(
      attention_pool_,
      AttentionServicePool::Create({.services = options_.attention_services,
                                    .worker_id = identity_.worker_id,
                                    .incarnation = identity_.incarnation,
                                    .lanes = options_.attention_lanes},
                                   ucx_.get()));
  AttentionOffloadOptions offload;
  offload.worker_id = identity_.worker_id;
  offload.num_q_heads = model_->info.num_attention_heads();
  offload.policy = options_.offload_policy;
  offload.attention_timeout = options_.attention_timeout;
  TRIDENT_ASSIGN_OR_RETURN(offload.pipeline, ParsePipelineMode(options_.offload_pipeline));
  const model::ModelConfig& c = model_->config;
  offload.pre_attention_share = PreAttentionShare(
      c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size);
  offload.keep_throughput = options_.offload_keep_throughput;
  offload.background_moves = options_.offload_background_moves;
  offload.background_move_threads = options_.offload_move_threads;
  offload.wake = [engine = model_->engine.get()] { engine->Wake(); };
  offload.max_step_time = options_.offload_max_step_time;
  TRIDENT_ASSIGN_OR_RETURN(offload_,
                           AttentionOffload::Create(std::move(offload), attention_pool_.get(),
                                                    &model_->engine->backend_for_setup()));
  model_->engine->SetStepHook(offload_.get());
  if (!options_.kv_tier || !options_.model.prefix_caching) return absl::OkStatus();
  TRIDENT_ASSIGN_OR_RETURN(kv_tier_, KvTier::Create(options_.kv_tier_options,
                                                    attention_pool_.get(), model_->engine.get()));
  // A sequence moved to the store's service reads its cached prefix there.
  if (kv_tier_->store() != nullptr) {
    offload_->EnableInPlacePrefixes(kv_tier_->format(), kv_tier_->store(),
                                    &model_->engine->cache_hasher());
  }
  std::function<void(int32_t)> on_dram_hit;
  if (model_->metrics != nullptr) {
    on_dram_hit = [metrics = model_->metrics](int32_t tokens) { metrics->AddDramHits(tokens); };
  }
  tiered_ = std::make_unique<TieredTokenSource>(model_->engine.get(), kv_tier_.get(),
                                                std::move(on_dram_hit));
  return absl::OkStatus();
}

void WorkerServer::BuildServices(prometheus::Registry* registry) {
  // KV-transfer metrics: the prefill side sends through a metered sender.
  kv_metrics_ = std::make_unique<transport::KvTransferMetrics>(*registry);
  if (kv_tier_ != nullptr) {
    kv_tier_metrics_ = std::make_unique<KvTierMetrics>(*registry);
    kv_tier_sampler_ = std::make_unique<transport::PeriodicSampler>(
        options_.kv_metrics_interval, [tier = kv_tier_.get(), metrics = kv_tier_metrics_.get()] {
          metrics->Sample(tier->stats());
        });
    if (kv_tier_->store() != nullptr) {
      kv_tier_events_poller_ = std::make_unique<transport::PeriodicSampler>(
          kKvTierEventsInterval,
          [tier = kv_tier_.get(), log = &dram_events_] { tier->PollStoreEvents(*log); });
    }
  }

  if (kv_ != nullptr) {
    metered_kv_ =
        std::make_unique<transport::MeteredKvSender>(ServiceKvSender(), kv_metrics_.get(), clock_);
  }
  if (model_ != nullptr && ucx_ != nullptr) {
    // The prefill side writes CPU-placed prompts straight into attention
    // services (sharing the offload's data-plane client when there is one).
    SharedAttentionClient shared;
    if (offload_ != nullptr) shared = {offload_->client(), offload_->endpoint()};
    absl::StatusOr<std::unique_ptr<PromptKvSender>> prompt_kv = PromptKvSender::Create(
        {.worker_id = identity_.worker_id, .incarnation = identity_.incarnation}, metered_kv_.get(),
        ucx_.get(), model_->engine->backend(), std::move(shared));
    if (prompt_kv.ok()) {
      prompt_kv_ = *std::move(prompt_kv);
    } else {
      TRIDENT_LOG(WARNING) << "this worker cannot write prompts to attention services: "
                           << prompt_kv.status();
    }
  }
  WorkerRoleOptions role_options;
  role_options.has_kv_transport = model_ == nullptr || kv_ != nullptr;
  role_options.registry = registry;
  role_options.announce = options_.role_change_announce;
  role_ = std::make_unique<WorkerRole>(options_.role, clock_, role_options);
  if (model_ == nullptr) return;
  // The public Generation API, served in role `both` (Generate answers
  // FAILED_PRECONDITION in the other roles).
  generation_gate_ = std::make_unique<RoleCallGate>(role_.get());
  engine::TokenSource* source = model_->engine.get();
  if (tiered_ != nullptr) source = tiered_.get();
  generation_ = std::make_unique<frontend::GenerationService>(
      source, model_->tokenizer.get(), model_->info, clock_, generation_gate_.get());
  DecodeServiceOptions decode_options;
  decode_options.worker_id = identity_.worker_id;
  decode_options.incarnation = identity_.incarnation;
  decode_options.address = options_.advertise_address;
  decode_options.worker_role = role_.get();
  decode_options.placer = offload_.get();
  decode_ = std::make_unique<DecodeService>(model_->engine.get(), model_->info, reservations_.get(),
                                            ServiceKvReceiver(), clock_, decode_options);
  PrefillServiceOptions prefill_options;
  prefill_options.worker_id = identity_.worker_id;
  prefill_options.worker_role = role_.get();
  prefill_options.testonly_stall_after_layers = options_.testonly_stall_kv_transfer_after_layers;
  prefill_options.testonly_stall_to_decode_worker = options_.testonly_stall_kv_transfer_to;
  prefill_options.token_source = tiered_.get();
  transport::KvSender* sender = prompt_kv_ != nullptr
                                    ? static_cast<transport::KvSender*>(prompt_kv_.get())
                                    : metered_kv_.get();
  prefill_ = std::make_unique<PrefillService>(model_->engine.get(), model_->info, sender, clock_,
                                              prefill_options);
}

void WorkerServer::StartLoadReports() {
  if (model_ != nullptr) {
    const engine::Engine& engine = *model_->engine;
    KvEventsSource kv_events;
    kv_events.log = engine.kv_events();
    if (kv_tier_ != nullptr && kv_tier_->store() != nullptr) kv_events.dram_log = &dram_events_;
    kv_events.cache_identity = engine.cache_hasher().model();
    kv_events.block_size_tokens = engine.cache_hasher().block_size();
    loads_ = std::make_unique<LoadStreams>([this] { return SampleLoad(); }, std::move(kv_events));
    kv_sampler_ = std::make_unique<transport::PeriodicSampler>(
        options_.kv_metrics_interval,
        [reservations = reservations_.get(), metrics = kv_metrics_.get(), kv = kv_.get()] {
          metrics->SetReservations(reservations->num_reservations(), reservations->blocks_held());
          if (kv != nullptr) metrics->SetDroppedMessages(kv->dropped_messages());
        });
  }
  control_ = std::make_unique<WorkerControlService>(
      model_ != nullptr ? model_->engine.get() : nullptr, loads_.get(), role_.get());
}

v1::WorkerLoad WorkerServer::SampleLoad() const {
  WorkerIdentity now = identity_;
  const WorkerRole::State state = role_->state();
  now.role = state.role;
  now.pending_role = state.pending_role;
  if (model_ == nullptr) {
    return WorkerLoadFromStats(now, engine::EngineStats(), 0, 0, absl::Now());
  }
  v1::WorkerLoad load =
      WorkerLoadFromStats(now, model_->engine->stats(), reservations_->blocks_held(),
                          reservations_->num_reservations(), absl::Now());
  load.set_colocated_only(kv_ == nullptr);
  if (kv_tier_ != nullptr && kv_tier_->store() != nullptr) {
    load.set_dram_hit_value(kv_tier_->DramHitValue());
  }
  return load;
}

absl::Status WorkerServer::JoinController(const controller_client::MemberAddresses& addresses) {
  if (options_.controller_address.empty() || member_ != nullptr) return absl::OkStatus();
  controller_client::ControllerMemberOptions member;
  member.controller_address = options_.controller_address;
  member.build_registration = [this, addresses] {
    WorkerIdentity now = identity_;
    now.role = role_->role();
    WorkerFacts facts;
    facts.device = DeviceOf(options_.model).ToString();
    facts.kv_block_size_tokens = options_.model.kv_block_size;
    facts.max_batch_sequences = options_.model.max_running;
    facts.max_prefill_batch_tokens = options_.model.max_batch_tokens;
    if (model_ != nullptr) {
      facts.model = model_->info.model();
      facts.max_context_tokens = model_->info.max_context_tokens();
      facts.kv_blocks_total = model_->engine->stats().blocks_total;
    }
    return WorkerRegisterRequest(now, facts, addresses);
  };
  member.fill_heartbeat = [this](v1::HeartbeatRequest* request) {
    FillWorkerHeartbeat(SampleLoad(), request);
  };
  member.backoff = options_.controller_backoff;
  // Workers restarted together should not retry in step.
  member.seed = identity_.incarnation;
  TRIDENT_ASSIGN_OR_RETURN(member_, controller_client::ControllerMember::Create(std::move(member)));
  member_->Start();
  TRIDENT_LOG(INFO) << "joining the controller at " << options_.controller_address << " as "
                    << identity_.worker_id << " at " << addresses.address;
  return absl::OkStatus();
}

void WorkerServer::LeaveController() {
  if (member_ != nullptr) member_->Stop();
}

std::vector<RegisteredService> WorkerServer::services() {
  std::vector<RegisteredService> services;
  if (model_ != nullptr) {
    services.push_back({generation_.get(), v1::Generation::service_full_name()});
    services.push_back({decode_.get(), v1::Decode::service_full_name()});
    services.push_back({prefill_.get(), v1::Prefill::service_full_name()});
  } else {
    services.push_back({&unserved_decode_, v1::Decode::service_full_name()});
    services.push_back({&unserved_prefill_, v1::Prefill::service_full_name()});
  }
  services.push_back({control_.get(), v1::WorkerControl::service_full_name()});
  return services;
}

}  // namespace trident::worker
