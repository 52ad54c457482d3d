// The decode worker's side of NEO-style offload: the engine's StepHook that
// moves resident sequences to CPU attention services and releases their
// copies there.
//
// Before each step (engine loop thread): the policy (offload_policy.h)
// picks sequences; each is admitted at the service with the fewest
// sequences (AdmitSequence, its whole max length reserved), its KV copied
// there layer by layer (append-only requests over the attention data plane,
// <= kMigrationChunkTokens tokens each), then EngineCore::MoveToRemote frees
// its blocks. A sequence that cannot move (the service's budget is full, it
// fails) stays resident; nothing is lost. With in-place prefixes on
// (EnableInPlacePrefixes: the KV tier's store), a sequence whose blocks
// are cached goes to the store's service instead, names their keys, and
// only the tokens past the leading blocks the store holds are copied: the
// service reads those in place (AdmitSequenceResponse.in_place_tokens).
//
// A long-context move (placement) is copied before the step. A
// pool-pressure move is copied in the background (background_move_threads
// at once, each on a migration thread) while the engine keeps stepping,
// the sequence still decoding here: copying a long sequence's KV takes many
// decode steps, and before the step every running sequence would wait for
// it. Once the copy
// is done, the next BeforeStep appends the tokens decoded meanwhile and
// moves the sequence; if it finished or lost its blocks (preempted) in
// between, the service's copy is released instead.
//
// A service copy no longer needed (finished, aborted, or its service
// failed: the engine then recomputes those sequences here) is released by
// the service pool's housekeeping thread (attention_service_pool.h), which
// also reconnects to services that failed, so that the engine loop never
// waits on them.
//
// BeforeStep, PlanBatch and OnRemoteReleased run on the engine loop thread;
// what moves, and what became of moves that did not, is counted in the
// engine's stats (EngineStats::remote_moves_total, remote_held_total, ...).

#ifndef TRIDENT_SERVICES_WORKER_OFFLOAD_ATTENTION_OFFLOAD_H_
#define TRIDENT_SERVICES_WORKER_OFFLOAD_ATTENTION_OFFLOAD_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/backend/model_backend.h"
#include "common/engine/engine.h"
#include "common/kv/block_hasher.h"
#include "common/transport/attention/ucx_attention_client.h"
#include "common/transport/ucx_lanes.h"
#include "common/transport/ucx_worker.h"
#include "services/worker/kv_handoff/kv_reservations.h"
#include "services/worker/offload/attention_service_pool.h"
#include "services/worker/offload/cost_tables.h"
#include "services/worker/offload/offload_policy.h"
#include "services/worker/offload/pipeline_planner.h"
#include "services/worker/offload/service_kv_copier.h"
#include "trident/v1/attention.grpc.pb.h"

namespace trident::worker {

struct AttentionOffloadOptions {
  // Names this worker's calibration sequences.
  std::string worker_id;
  // The model's query heads (AdmitSequence's num_attention_heads).
  int32_t num_q_heads = 0;
  OffloadPolicyOptions policy;
  // Asymmetric pipelining of decode steps with CPU-resident sequences:
  // kAuto plans each step from cost tables measured at start-up (the
  // backend's, and each service's at its first connection).
  PipelineMode pipeline = PipelineMode::kAuto;
  // The planner's StepCosts::pre_attention_share (PreAttentionShare of the
  // model).
  double pre_attention_share = kDefaultPreAttentionShare;
  // Copy pool-pressure moves in the background (see the header comment);
  // off: before the step, like long-context moves.
  bool background_moves = true;
  // Background moves copied at once, each on a migration thread of its own.
  int32_t background_move_threads = 2;
  // Called (migration thread) when a background copy is done, so that an
  // engine loop waiting for blocks steps again (engine::Engine::Wake).
  std::function<void()> wake;
  // Move a sequence only while the cost tables say the step keeps its
  // throughput with it (MoveKeepsThroughput); the rest wait for blocks as
  // without offload. Off: every sequence the policy chooses moves.
  bool keep_throughput = false;
  // Move a sequence only while the cost tables say the decode step (one
  // token of every sequence) stays within this, with the moved sequence on
  // the CPU and a waiting one in its blocks (MoveKeepsStepTime): the TPOT
  // target offload must not break. Zero: no limit.
  absl::Duration max_step_time = absl::ZeroDuration();
  // The longest a layer waits for a service's answer.
  absl::Duration attention_timeout = absl::Seconds(5);
};

class AttentionOffload final : public engine::StepHook, public PromptPlacer {
 public:
  // Offloads to `pool`'s services, calibrating each connected one; `pool`
  // and `backend` must outlive this. INVALID_ARGUMENT for a backend without
  // remote attention or without a host KV pool.
  static absl::StatusOr<std::unique_ptr<AttentionOffload>> Create(AttentionOffloadOptions options,
                                                                  AttentionServicePool* pool,
                                                                  backend::ModelBackend* backend);
  // Stops the migration threads; copies not yet released are freed by their
  // services when this worker's session ends (its grace period).
  ~AttentionOffload() override;

  void BeforeStep(engine::EngineCore& core) override;
  void OnRemoteReleased(const std::string& id, const backend::RemoteKv& remote) override;
  // Marks the CPU-resident sequences of the second sub-batch (PlanPipeline),
  // and notes the CPU time planned for a decode-only step.
  void PlanBatch(absl::Span<backend::StepSequence> batch) override;

  // PromptPlacer: a long-context prompt (Decode.ReserveKv) admitted at the
  // service with the fewest sequences; its prefill worker writes it there.
  // With max_step_time, Place refuses (RESOURCE_EXHAUSTED) a sequence if
  // the decode step planned with it at its longest, beside the CPU-resident
  // ones and the placements not yet joined, would exceed it.
  bool PlacesOnCpu(int32_t max_total_tokens) const override;
  void Place(const std::string& request_id, int32_t num_tokens, int32_t capacity_tokens,
             absl::Span<const int32_t> prompt, const std::string& cache_salt,
             PlaceDone done) override;

  // Moves name each sequence's cached leading blocks (`format`'s keys), and
  // go to `store` (the KV tier's block store service) when it is
  // connected, which reads the blocks it holds in place: only the rest is
  // copied. Call before the engine runs.
  // `hasher` (the engine's, outliving this) names a placed prompt's blocks.
  void EnableInPlacePrefixes(trident::v1::BlockFormat format, AttentionServicePool::Service* store,
                             const kv::BlockHasher* hasher);

  // The attention data plane's client and this worker's endpoint, for the
  // prefill side's PromptKvSender to share.
  transport::attention::UcxAttentionClient* client() const { return pool_->client(); }
  const trident::v1::TransportEndpoint& endpoint() const { return pool_->endpoint(); }

  // Tokens per append request of a move.
  static constexpr int32_t kMigrationChunkTokens = ServiceKvCopier::kChunkTokens;

 private:
  using Service = AttentionServicePool::Service;
  using CopyScratch = ServiceKvCopier::Scratch;
  // A background move: the candidate as chosen (its KV up to num_computed
  // is copied), the service and, once admitted, the handle there.
  struct Migration {
    engine::OffloadCandidate candidate;
    Service* service = nullptr;
    transport::attention::RemoteAttention* channel = nullptr;
    bool started = false;  // A migration thread has it.
    bool admitted = false;
    uint64_t handle = 0;
    int32_t in_place_tokens = 0;  // Read from the service's block store.
    absl::Time start;
    double planned_step_seconds = 0;
    bool done = false;
    absl::Status status;
  };

  // Lets placements held by reservations (which may outlive this) release
  // their service copies through this offload while it lives.
  struct ReleaseSink {
    absl::Mutex mu;
    AttentionOffload* offload ABSL_GUARDED_BY(mu) = nullptr;
  };

  AttentionOffload(AttentionOffloadOptions options, AttentionServicePool* pool,
                   backend::ModelBackend* backend);
  absl::Status Start();
  // Admits `candidate` at `service`, copies its KV and moves it.
  absl::Status Move(engine::EngineCore& core, const engine::OffloadCandidate& candidate,
                    Service& service);
  // Brings step_costs_.cpu_scale toward what the last planned decode step's
  // CPU requests took (the engine's round-trip total, cumulative). Engine
  // loop thread.
  void ObserveCpuCosts(double round_trip_seconds_total);
  // Whether the guards let `candidate` move (keep_throughput on `next`,
  // with `backlog` waiting sequences that could follow it; max_step_time on
  // `longest`); sets *planned to the planned decode step with it.
  bool MayMove(const engine::OffloadCandidate& candidate, const StepShape& next,
               const StepShape& longest, int32_t backlog, double* planned) const;
  void LogMove(const std::string& id, int32_t tokens, const Service& service, absl::Duration took,
               double planned_step_seconds, size_t cpu_resident, bool background) const;
  // Hands `candidate` to the migration thread.
  void StartMigration(const engine::OffloadCandidate& candidate, Service& service,
                      double planned_step_seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // For each background copy that is done: appends what was decoded
  // meanwhile and moves the sequence, or releases the copy. Engine loop
  // thread.
  void FinishMigrations(engine::EngineCore& core) ABSL_LOCKS_EXCLUDED(mu_);
  void FinishMigration(engine::EngineCore& core, std::unique_ptr<Migration> m)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A migration thread: copies the migrations no thread has taken yet.
  void MigrationLoop(CopyScratch& scratch);
  // Copies positions [first, candidate.num_computed) of the candidate's KV
  // to `handle`.
  absl::Status CopyKv(const engine::OffloadCandidate& candidate, int32_t first,
                      transport::attention::RemoteAttention& channel, uint64_t handle,
                      CopyScratch& scratch) const;
  // AdmitSequence for `id` with room for `capacity` tokens, naming
  // `keys` (its cached leading blocks) when in-place prefixes are on.
  // Place's placement of `request_id`, admitted at `service` as `admitted`
  // says.
  PromptPlacement Placed(Service& service, const std::string& request_id, int32_t num_tokens,
                         int32_t capacity_tokens,
                         const trident::v1::AdmitSequenceResponse& admitted);
  absl::StatusOr<trident::v1::AdmitSequenceResponse> Admit(
      Service& service, const std::string& id, int32_t capacity,
      absl::Span<const kv::BlockKey> keys = {});
  // The service a move of `candidate` goes to: the block store's, for a
  // sequence with cached blocks when in-place prefixes are on and it is
  // connected; else the pool's choice. Null when none is connected.
  Service* PickFor(absl::Span<const kv::BlockKey> keys) const;
  // The service's cost table (MeasureServiceCosts on a calibration
  // sequence, released after).
  absl::Status Calibrate(Service& service);
  // Place's step-time guard; OK when the step with the placement stays
  // within max_step_time.
  absl::Status CheckPlacementStepTime(int32_t capacity_tokens) ABSL_LOCKS_EXCLUDED(mu_);
  const kv::KvCacheSpec& spec() const { return kv_copier_->memory().spec; }
  // A placement nobody took (its reservation ended): no longer awaited by
  // the engine, and its service copy released.
  void ReleasePlacement(const backend::RemoteKv& kv) ABSL_LOCKS_EXCLUDED(mu_);
  // The engine's count of joined placements is now `placed_total`: as many
  // of the oldest unjoined placements as it grew by have joined.
  void NotePlacementsJoined(int64_t placed_total) ABSL_LOCKS_EXCLUDED(mu_);

  const AttentionOffloadOptions options_;
  backend::ModelBackend* const backend_;
  // EnableInPlacePrefixes's (set before the engine runs).
  std::optional<trident::v1::BlockFormat> in_place_format_;
  Service* in_place_store_ = nullptr;
  const kv::BlockHasher* in_place_hasher_ = nullptr;
  AttentionServicePool* const pool_;
  // Copies KV to services; its pool's spec is this worker's.
  std::unique_ptr<ServiceKvCopier> kv_copier_;
  // Cost tables measured in Start, and the planner's inputs from them;
  // shape_ is scratch of PlanBatch (engine loop thread).
  BackendCosts backend_costs_;
  StepCosts step_costs_;
  StepShape shape_;
  // PlanBatch's CPU seconds for its step (0: not a decode-only step), and
  // the engine's round-trip total as last seen (engine loop thread).
  double planned_cpu_step_seconds_ = 0;
  double round_trip_seconds_seen_ = 0;
  // The engine's placed-sequence count as last seen (engine loop thread).
  int64_t placed_seen_ = 0;
  // Placements refused by the step-time guard, not yet counted in the
  // engine's offload decisions (BeforeStep counts them as held).
  std::atomic<int64_t> placements_held_{0};
  CopyScratch loop_scratch_;  // engine loop thread only
  // One per migration thread (sized in Start, before they run).
  std::vector<CopyScratch> migration_scratch_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // What Place's step-time guard judges: the decode step as the last
  // BeforeStep planned it (CPU-resident sequences at their contexts then,
  // background moves at their longest), its costs, and the placements not
  // yet joined to the engine (handle, longest context), oldest first.
  StepShape placement_shape_ ABSL_GUARDED_BY(mu_);
  StepCosts placement_costs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<uint64_t, int64_t>> unjoined_placements_ ABSL_GUARDED_BY(mu_);
  // Background moves, from StartMigration to FinishMigrations (a migration
  // thread works on each while it is started and not done).
  std::vector<std::unique_ptr<Migration>> migrations_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> migrators_;
  const std::shared_ptr<ReleaseSink> release_sink_;
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_OFFLOAD_ATTENTION_OFFLOAD_H_
