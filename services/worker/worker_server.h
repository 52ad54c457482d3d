// A worker process's parts, wired together: the model and its engine, the
// role, the KV reservations, the KV data plane and the gRPC services over
// them. main.cc fills WorkerServerOptions from its flags and serves
// services(); tests build one on a small generated model and serve it on
// port 0.
//
// What it owns, built top to bottom and destroyed bottom to top (the engine
// is shut down first):
//
//   WorkerModel                tokenizer, engine     (none without a model)
//   WorkerRole                 shared by every service, changed by SetRole
//   KvReservations             on the engine's blocks (EngineBlockSource)
//   UcxWorker, UcxKv           the KV data plane; received KV messages go
//                              into the reservations (its KvMessageSink)
//   MeteredKvSender            UcxKv's sending side, with metrics
//   PromptKvSender             the prefill side's sender: CPU-placed
//                              prompts to attention services, the rest
//                              through the metered sender
//   AttentionOffload           with attention services: the engine's step
//                              hook moving sequences to them
//   services                   Generation (with a model), Decode (the
//                              reservations; UcxKv as KvReceiver), Prefill
//                              (the metered sender), WorkerControl (load
//                              streams), and the KV metrics sampler
//   ControllerMember           with a controller address, once serving
//                              (JoinController): registration and
//                              heartbeats carrying the load samples
//
// Without a model, Decode and Prefill answer UNIMPLEMENTED and Generation is
// not served. Without a KV transport (kv_transport none, or auto in role
// both), ReserveKv and Prefill with a destination answer FAILED_PRECONDITION
// and the role stays `both`.

#ifndef TRIDENT_SERVICES_WORKER_WORKER_SERVER_H_
#define TRIDENT_SERVICES_WORKER_WORKER_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/controller_client/backoff.h"
#include "common/controller_client/controller_member.h"
#include "common/controller_client/member_address.h"
#include "common/frontend/generation_service.h"
#include "common/grpc/server.h"
#include "common/time/clock.h"
#include "common/transport/kv/transfer_metrics.h"
#include "common/transport/kv/peer_lane_kv.h"
#include "common/transport/kv/ucx_kv.h"
#include "common/transport/ucx_worker.h"
#include "prometheus/registry.h"
#include "services/worker/decode_service.h"
#include "services/worker/kv_handoff/engine_block_source.h"
#include "services/worker/kv_handoff/kv_reservations.h"
#include "services/worker/load_streams.h"
#include "services/worker/offload/attention_offload.h"
#include "services/worker/kv_tier/kv_tier.h"
#include "services/worker/offload/attention_service_pool.h"
#include "services/worker/offload/offload_policy.h"
#include "services/worker/offload/prompt_kv_sender.h"
#include "services/worker/prefill_service.h"
#include "services/worker/role_call_gate.h"
#include "services/worker/worker_model.h"
#include "services/worker/worker_role.h"
#include "services/worker/worker_services.h"
#include "trident/v1/cluster.pb.h"

namespace trident::worker {

// How KV moves between prefill and decode workers.
enum class KvTransportKind {
  // UCX for roles prefill and decode, none for role both.
  kAuto,
  // The UCX data plane (common/transport/kv/ucx_kv.h).
  kUcx,
  // None: no disaggregation.
  kNone,
};

// Parses "auto", "ucx" or "none"; INVALID_ARGUMENT naming --kv_transport.
absl::StatusOr<KvTransportKind> ParseKvTransport(absl::string_view text);

struct WorkerServerOptions {
  // The initial role; WorkerControl.SetRole changes it at run time.
  trident::v1::Role role = trident::v1::ROLE_BOTH;
  // The model to load (model.model_dir; empty: none) and where it runs
  // (model.cuda_device).
  WorkerModelOptions model;
  // Reported in load samples and KV endpoints; empty: "worker-<pid>".
  std::string worker_id;
  // This process's incarnation (TransportEndpoint.incarnation); 0: a random
  // odd number.
  uint64_t incarnation = 0;
  // host:port peers use to reach this worker (KvDestination.decode_address);
  // empty: peers use the address they know it by.
  std::string advertise_address;
  KvTransportKind kv_transport = KvTransportKind::kAuto;
  // UCX_TLS of the KV data plane's workers; empty: UCX's own choice.
  std::string ucx_transports = "^sysv";
  // A KV pool in device memory that UCX cannot register is staged through
  // this much pinned host memory (UcxKvOptions::staging_bytes).
  uint64_t kv_staging_bytes = uint64_t{256} << 20;
  // UcxKvOptions::lanes; 0: 2 for a KV pool on a GPU, else 1.
  int32_t kv_lanes = 0;
  // KV to decode workers on this host goes GPU to GPU (CUDA IPC) when both
  // pools are on GPUs (transport/kv/peer_lane_kv.h); false: over UCX only.
  bool kv_peer_lane = true;
  // UcxKvOptions::receive_threads and receive_fetches.
  int32_t kv_receive_threads = 2;
  int32_t kv_receive_fetches = 4;
  // PrefillServiceOptions::testonly_stall_after_layers (fault injection).
  int32_t testonly_stall_kv_transfer_after_layers = -1;
  // PrefillServiceOptions::testonly_stall_to_decode_worker.
  std::string testonly_stall_kv_transfer_to;
  // CPU attention services (host:port) to offload decode attention to;
  // empty: none (services/worker/offload).
  std::vector<std::string> attention_services;
  OffloadPolicyOptions offload_policy;
  // With attention services: the DRAM tier of the prefix cache (KvTier:
  // write-through to, and fetches from, a service's block store), --kv_tier.
  bool kv_tier = true;
  KvTierOptions kv_tier_options;
  // auto, always or never (--offload_pipeline).
  std::string offload_pipeline = "auto";
  // WorkerRoleOptions::announce (--role_change_announce).
  absl::Duration role_change_announce = absl::ZeroDuration();
  // AttentionOffloadOptions::background_moves (--offload_background_moves).
  bool offload_background_moves = true;
  // AttentionOffloadOptions::background_move_threads (--offload_move_threads).
  int32_t offload_move_threads = 2;
  // AttentionOffloadOptions::keep_throughput (--offload_keep_throughput).
  bool offload_keep_throughput = false;
  // AttentionOffloadOptions::max_step_time (--offload_max_step_time).
  absl::Duration offload_max_step_time = absl::ZeroDuration();
  // The longest a decode step waits for a service's answer before its
  // sequences are recomputed here.
  absl::Duration attention_timeout = absl::Seconds(5);
  // UCX lanes to the attention services (--attention_lanes).
  int32_t attention_lanes = 1;
  // host:port of the controller (trident.v1.Controller) to register with
  // and heartbeat to once serving (JoinController); empty: none.
  std::string controller_address;
  // Retry bounds of the controller client.
  controller_client::BackoffOptions controller_backoff;
  // How often the KV reservation gauges and the dropped-message counter are
  // sampled.
  absl::Duration kv_metrics_interval = absl::Milliseconds(250);
  // Not owned; must outlive the server. Null: a RealClock of its own.
  Clock* clock = nullptr;
};

// Thread-safe: every part is; the accessors return what was built at Create.
class WorkerServer {
 public:
  // Loads the model, sets up the KV data plane and builds the services.
  // `registry` (not owned; must outlive the server) takes the worker's
  // metrics. Errors: LoadWorkerModel's (INVALID_ARGUMENT,
  // FAILED_PRECONDITION naming the file or option), UcxWorker::Create's and
  // UcxKv::Create's (the UCX transports, the KV pool), the backend's for its
  // KV memory.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Create(WorkerServerOptions options,
                                                              prometheus::Registry* registry);

  // Leaves the controller, shuts the engine down (failing what is still in
  // it), then destroys the parts in the reverse order of the file comment's
  // table. Stop serving services() first.
  ~WorkerServer();

  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;

  // The gRPC services to serve: Decode, Prefill, WorkerControl, and
  // Generation with a model. They live as long as this.
  std::vector<RegisteredService> services();

  // With options.controller_address: registers with the controller as
  // reached at `addresses` (the gRPC server now serving services()), in
  // the role now in effect and with the capacity of the loaded model, then
  // heartbeats the load sample GetLoad streams (state SERVING, DRAINING
  // while a role change drains) until LeaveController. Retries in the
  // background while the controller is unreachable; role directives on the
  // heartbeat stream are logged, not applied (the controller calls
  // WorkerControl.SetRole). Without a controller address, does nothing.
  // Errors: INVALID_ARGUMENT from ControllerMember::Create. Call once.
  absl::Status JoinController(const controller_client::MemberAddresses& addresses);

  // Deregisters from the controller (bounded by a short deadline) and stops
  // heartbeating; nothing if not joined. Idempotent.
  void LeaveController();

  // A load sample: the engine's figures (none without a model), this
  // process's identity and role. What GetLoad streams and heartbeats carry.
  trident::v1::WorkerLoad SampleLoad() const;

  // Null unless joined.
  const controller_client::ControllerMember* ControllerMemberForTesting() const {
    return member_.get();
  }

  // What a test checks. The identity load samples and KV endpoints carry.
  const WorkerIdentity& IdentityForTesting() const { return identity_; }
  // Null without a model.
  const engine::Engine* EngineForTesting() const {
    return model_ != nullptr ? model_->engine.get() : nullptr;
  }
  // Null without a model.
  const KvReservations* ReservationsForTesting() const { return reservations_.get(); }
  // Null without a KV transport.
  const transport::UcxKv* KvTransportForTesting() const { return kv_.get(); }

 private:
  explicit WorkerServer(WorkerServerOptions options);

  // Create's steps, in order.
  absl::Status LoadModel(prometheus::Registry* registry);
  absl::Status StartKvTransport();
  // What the services send and receive KV through: peer_kv_, else kv_
  // (null without a KV transport).
  transport::KvSender* ServiceKvSender() const {
    return peer_kv_ != nullptr ? static_cast<transport::KvSender*>(peer_kv_.get()) : kv_.get();
  }
  transport::KvReceiver* ServiceKvReceiver() const {
    return peer_kv_ != nullptr ? static_cast<transport::KvReceiver*>(peer_kv_.get()) : kv_.get();
  }
  absl::Status StartOffload();
  void BuildServices(prometheus::Registry* registry);
  void StartLoadReports();

  const WorkerServerOptions options_;
  RealClock own_clock_;
  Clock* const clock_;
  WorkerIdentity identity_;
  std::unique_ptr<WorkerModel> model_;
  std::unique_ptr<WorkerRole> role_;
  std::unique_ptr<EngineBlockSource> blocks_;
  std::unique_ptr<KvReservations> reservations_;
  std::unique_ptr<transport::UcxWorker> ucx_;
  std::unique_ptr<transport::UcxKv> kv_;
  // Over kv_, with the GPU-to-GPU lane; null without one. The services send
  // and receive KV through it when there is one (KvSender, KvReceiver).
  std::unique_ptr<transport::PeerLaneKv> peer_kv_;
  std::unique_ptr<AttentionServicePool> attention_pool_;
  std::unique_ptr<AttentionOffload> offload_;
  // Before the tier: the tier's fetch threads (joined when it goes) hand
  // prepared requests to it.
  std::unique_ptr<TieredTokenSource> tiered_;
  // The tier's mirror of its store's KV events: before the tier, which
  // writes it, and the load streams, which read it.
  kv::KvEventLog dram_events_;
  std::unique_ptr<KvTier> kv_tier_;
  std::unique_ptr<KvTierMetrics> kv_tier_metrics_;
  std::unique_ptr<transport::PeriodicSampler> kv_tier_sampler_;
  // Polls the store's KV events into dram_events_.
  std::unique_ptr<transport::PeriodicSampler> kv_tier_events_poller_;
  std::unique_ptr<transport::KvTransferMetrics> kv_metrics_;
  std::unique_ptr<transport::MeteredKvSender> metered_kv_;
  std::unique_ptr<PromptKvSender> prompt_kv_;
  std::unique_ptr<RoleCallGate> generation_gate_;
  std::unique_ptr<frontend::GenerationService> generation_;
  std::unique_ptr<DecodeService> decode_;
  std::unique_ptr<PrefillService> prefill_;
  UnservedDecodeService unserved_decode_;
  UnservedPrefillService unserved_prefill_;
  std::unique_ptr<LoadStreams> loads_;
  std::unique_ptr<transport::PeriodicSampler> kv_sampler_;
  std::unique_ptr<WorkerControlService> control_;
  // Last: its thread samples the parts above, so it goes first.
  std::unique_ptr<controller_client::ControllerMember> member_;
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_WORKER_SERVER_H_
