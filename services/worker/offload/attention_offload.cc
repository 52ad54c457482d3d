#include "services/worker/offload/attention_offload.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc/status.h"
#include "common/kv/kv_layout.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"
#include "grpcpp/grpcpp.h"

namespace trident::worker {
namespace v1 = ::trident::v1;

AttentionOffload::AttentionOffload(AttentionOffloadOptions options, AttentionServicePool* pool,
                                   backend::ModelBackend* backend)
    : options_(std::move(options)),
      backend_(backend),
      pool_(pool),
      release_sink_(std::make_shared<ReleaseSink>()) {
  absl::MutexLock lock(&release_sink_->mu);
  release_sink_->offload = this;
}

absl::StatusOr<std::unique_ptr<AttentionOffload>> AttentionOffload::Create(
    AttentionOffloadOptions options, AttentionServicePool* pool, backend::ModelBackend* backend) {
  if (!backend->supports_remote_attention()) {
    return absl::InvalidArgumentError(
        "this backend cannot compute attention at a service (no remote attention; a CUDA "
        "worker with --kv_cache_dtype=fp8_e4m3 has none: use bf16 with --attention_services)");
  }
  if (options.background_move_threads < 1 || options.background_move_threads > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--offload_move_threads: expected 1 to 64, got ",
                                                   options.background_move_threads));
  }
  auto offload =
      std::unique_ptr<AttentionOffload>(new AttentionOffload(std::move(options), pool, backend));
  TRIDENT_RETURN_IF_ERROR(offload->Start());
  return offload;
}

absl::Status AttentionOffload::Start() {
  TRIDENT_ASSIGN_OR_RETURN(kv_copier_, ServiceKvCopier::Create(*backend_));
  backend_->set_remote_attention_timeout(options_.attention_timeout);
  if (options_.pipeline == PipelineMode::kAuto) {
    absl::StatusOr<BackendCosts> costs = MeasureBackendCosts(*backend_);
    if (costs.ok()) {
      backend_costs_ = *std::move(costs);
      TRIDENT_LOG(INFO) << "pipelining cost table: linear layers "
                        << backend_costs_.linear.At(1) * 1e6 << " us a layer at 1 token, "
                        << backend_costs_.linear.At(64) * 1e6 << " us at 64";
    } else {
      TRIDENT_LOG(WARNING) << "no pipelining: the backend's costs were not measured: "
                           << costs.status();
    }
  }
  for (Service* service : pool_->services()) {
    if (!pool_->connected(*service) || options_.pipeline != PipelineMode::kAuto) continue;
    // Before the engine's hook is installed: the channel is ours alone.
    absl::Status calibrated = Calibrate(*service);
    if (!calibrated.ok()) {
      TRIDENT_LOG(WARNING) << "attention service " << service->address
                           << ": its costs were not measured (no pipelining to it): "
                           << calibrated;
    }
  }
  // The planner's inputs, fixed from here on: the backend's table and the
  // slowest calibrated service's (a step waits for each service).
  step_costs_ = StepCosts{.linear = backend_costs_.linear,
                          .local_attention = backend_costs_.local_attention,
                          .pre_attention_share = options_.pre_attention_share};
  for (const Service* service : pool_->services()) {
    if (!service->calibrated) continue;
    if (step_costs_.cpu_attention.empty() ||
        service->costs.attention.At(4096) > step_costs_.cpu_attention.At(4096)) {
      step_costs_.cpu_attention = service->costs.attention;
    }
    step_costs_.round_trip_seconds =
        std::max(step_costs_.round_trip_seconds, service->costs.round_trip_seconds);
    step_costs_.per_sequence_seconds =
        std::max(step_costs_.per_sequence_seconds, service->costs.per_sequence_seconds);
  }
  {
    absl::MutexLock lock(&mu_);
    placement_costs_ = step_costs_;
  }
  migration_scratch_.resize(std::max(1, options_.background_move_threads));
  for (size_t slot = 0; slot < migration_scratch_.size(); ++slot) {
    migrators_.emplace_back([this, slot] { MigrationLoop(migration_scratch_[slot]); });
  }
  return absl::OkStatus();
}

AttentionOffload::~AttentionOffload() {
  {
    // Placements released from now on go with this worker's session.
    absl::MutexLock lock(&release_sink_->mu);
    release_sink_->offload = nullptr;
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  // A copy under way ends first (each of its waits is bounded); its service
  // copy, if any, goes with this worker's session.
  for (std::thread& migrator : migrators_) migrator.join();
}

absl::Status AttentionOffload::Calibrate(Service& service) {
  const int32_t context = std::min(2048, backend_->max_model_len());
  TRIDENT_ASSIGN_OR_RETURN(
      const v1::AdmitSequenceResponse admitted,
      Admit(service, absl::StrCat("calibration-", options_.worker_id), context));
  transport::attention::RemoteAttention* channel = pool_->channel(service);
  // And a batch of one-token sequences for the cost of each sequence a
  // request carries; without room for them (a small budget), none.
  constexpr int32_t kBatch = 16;
  std::vector<uint64_t> batch;
  for (int32_t i = 0; i < kBatch; ++i) {
    absl::StatusOr<v1::AdmitSequenceResponse> one =
        Admit(service, absl::StrCat("calibration-", options_.worker_id, "-", i), 1);
    if (!one.ok()) {
      TRIDENT_LOG(WARNING) << "attention service " << service.address
                           << ": no per-sequence cost measured: " << one.status();
      for (uint64_t handle : batch) pool_->ReleaseAt(service, handle).IgnoreError();
      batch.clear();
      break;
    }
    batch.push_back(one->handle());
  }
  ServiceProbe probe{.channel = channel,
                     .num_q_heads = options_.num_q_heads,
                     .num_kv_heads = spec().num_kv_heads,
                     .head_dim = spec().head_dim,
                     .num_layers = spec().num_layers,
                     .dtype = kv_copier_->wire_dtype(),
                     .max_context = context,
                     .timeout = options_.attention_timeout};
  absl::StatusOr<ServiceCosts> costs = MeasureServiceCosts(probe, admitted.handle(), batch);
  pool_->ReleaseAt(service, admitted.handle()).IgnoreError();
  for (uint64_t handle : batch) pool_->ReleaseAt(service, handle).IgnoreError();
  TRIDENT_RETURN_IF_ERROR(costs.status());
  TRIDENT_LOG(INFO) << "attention service " << service.address << ": round trip "
                    << costs->round_trip_seconds * 1e6 << " us, attention over " << context
                    << " tokens " << costs->attention.At(context) * 1e6 << " us more, "
                    << costs->per_sequence_seconds * 1e6 << " us per sequence of a request";
  service.costs = *std::move(costs);
  service.calibrated = true;
  return absl::OkStatus();
}

absl::StatusOr<v1::AdmitSequenceResponse> AttentionOffload::Admit(
    Service& service, const std::string& id, int32_t capacity,
    absl::Span<const kv::BlockKey> keys) {
  AdmitPrefix prefix;
  if (in_place_format_.has_value()) prefix = {.format = &*in_place_format_, .keys = keys};
  return pool_->Admit(service, id, capacity, spec(), options_.num_q_heads, prefix);
}

void AttentionOffload::EnableInPlacePrefixes(v1::BlockFormat format,
                                             AttentionServicePool::Service* store,
                                             const kv::BlockHasher* hasher) {
  in_place_format_ = std::move(format);
  in_place_store_ = store;
  in_place_hasher_ = hasher;
}

AttentionOffload::Service* AttentionOffload::PickFor(absl::Span<const kv::BlockKey> keys) const {
  if (in_place_store_ != nullptr && !keys.empty() &&
      pool_->channel(*in_place_store_) != nullptr) {
    return in_place_store_;
  }
  return pool_->PickService();
}

bool AttentionOffload::PlacesOnCpu(int32_t max_total_tokens) const {
  return options_.policy.min_context_tokens > 0 &&
         max_total_tokens >= options_.policy.min_context_tokens;
}

void AttentionOffload::Place(const std::string& request_id, int32_t num_tokens,
                             int32_t capacity_tokens, absl::Span<const int32_t> prompt,
                             const std::string& cache_salt, PlaceDone done) {
  if (absl::Status guard = CheckPlacementStepTime(capacity_tokens); !guard.ok()) {
    std::move(done)(guard);
    return;
  }
  std::vector<kv::BlockKey> keys;
  if (in_place_hasher_ != nullptr && !prompt.empty()) {
    keys = in_place_hasher_->PrefixKeys(cache_salt, prompt);
  }
  Service* service = PickFor(keys);
  if (service == nullptr) {
    std::move(done)(absl::UnavailableError("no attention service is connected"));
    return;
  }
  AdmitPrefix prefix;
  if (in_place_format_.has_value()) prefix = {.format = &*in_place_format_, .keys = keys};
  pool_->AdmitAsync(
      *service, request_id, capacity_tokens, spec(), options_.num_q_heads, prefix,
      [this, service, request_id, num_tokens, capacity_tokens,
       done = std::move(done)](absl::StatusOr<v1::AdmitSequenceResponse> admitted) mutable {
        if (!admitted.ok()) {
          pool_->NoteFailure(*service, admitted.status());
          std::move(done)(admitted.status());
          return;
        }
        std::move(done)(Placed(*service, request_id, num_tokens, capacity_tokens, *admitted));
      });
}

PromptPlacement AttentionOffload::Placed(Service& service, const std::string& request_id,
                                         int32_t num_tokens, int32_t capacity_tokens,
                                         const v1::AdmitSequenceResponse& admitted) {
  PromptPlacement out;
  RemotePlacement& placement = out.placement;
  placement.kv = backend::RemoteKv{pool_->channel(service), admitted.handle()};
  placement.service_id = pool_->service_id(service);
  pool_->CountSequence(service, +1);
  {
    absl::MutexLock lock(&mu_);
    unjoined_placements_.emplace_back(admitted.handle(), capacity_tokens);
  }
  // Until the engine takes it, the reservation releases it (the
  // housekeeping thread calls the service).
  placement.release = [sink = release_sink_, kv = placement.kv] {
    absl::MutexLock lock(&sink->mu);
    if (sink->offload != nullptr) sink->offload->ReleasePlacement(kv);
  };
  v1::KvDestination* destination = &out.destination;
  *destination->mutable_endpoint() = admitted.endpoint();
  *destination->mutable_layout() = admitted.layout();
  *destination->mutable_regions() = admitted.regions();
  // The service reads the leading blocks it holds in place: the writer
  // skips them, and the sequence's own blocks follow.
  const int32_t block_size = std::max(1, admitted.layout().block_size_tokens());
  const int32_t in_place_blocks = admitted.in_place_tokens() / block_size;
  destination->set_num_cached_blocks(in_place_blocks);
  for (int32_t b = in_place_blocks; b * block_size < num_tokens; ++b) {
    destination->add_block_ids(b - in_place_blocks);
  }
  destination->set_cpu_resident(true);
  destination->set_attention_service_id(placement.service_id);
  destination->set_attention_address(service.address);
  destination->set_attention_handle(admitted.handle());
  destination->set_attention_write_key(admitted.write_key());
  TRIDENT_LOG(INFO) << "placed request " << request_id << " (" << num_tokens
                    << " prompt tokens, up to " << capacity_tokens << ") at attention service "
                    << placement.service_id << "; its prefill worker writes the prompt there"
                    << (in_place_blocks > 0 ? absl::StrCat(" past the ", admitted.in_place_tokens(),
                                                           " tokens the service reads in place")
                                            : "");
  return out;
}

absl::Status AttentionOffload::CheckPlacementStepTime(int32_t capacity_tokens) {
  const double max_step = absl::ToDoubleSeconds(options_.max_step_time);
  if (max_step <= 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  StepShape shape = placement_shape_;
  for (const auto& [handle, context] : unjoined_placements_) shape.cpu_contexts.push_back(context);
  double planned = 0;
  if (MoveKeepsStepTime(shape, placement_costs_, options_.pipeline, capacity_tokens,
                        spec().num_layers, max_step, &planned)) {
    return absl::OkStatus();
  }
  placements_held_.fetch_add(1, std::memory_order_relaxed);
  return absl::ResourceExhaustedError(
      absl::StrCat("placing it on a CPU attention service would make the decode step ",
                   planned * 1e3, " ms, over --offload_max_step_time ", max_step * 1e3, " ms"));
}

void AttentionOffload::ReleasePlacement(const backend::RemoteKv& kv) {
  {
    absl::MutexLock lock(&mu_);
    std::erase_if(unjoined_placements_, [&](const auto& p) { return p.first == kv.handle; });
  }
  OnRemoteReleased("", kv);
}

void AttentionOffload::NotePlacementsJoined(int64_t placed_total) {
  const int64_t joined = placed_total - placed_seen_;
  placed_seen_ = placed_total;
  absl::MutexLock lock(&mu_);
  for (int64_t i = 0; i < joined && !unjoined_placements_.empty(); ++i) {
    unjoined_placements_.pop_front();
  }
}

void AttentionOffload::PlanBatch(absl::Span<backend::StepSequence> batch) {
  shape_ = StepShape{};
  bool decode_only = true;
  for (const backend::StepSequence& s : batch) {
    decode_only = decode_only && s.tokens.size() == 1;
    const int64_t context = s.start_position + static_cast<int64_t>(s.tokens.size());
    if (s.remote.service != nullptr) {
      shape_.cpu_contexts.push_back(context);
    } else {
      shape_.local_tokens += static_cast<int64_t>(s.tokens.size());
      shape_.local_context_tokens += context;
    }
  }
  const PipelinePlan plan = PlanPipeline(shape_, step_costs_, options_.pipeline);
  // A step with prompt chunks keeps the answers waiting behind them: only
  // decode steps teach the planner the service's speed (ObserveCpuCosts).
  planned_cpu_step_seconds_ = decode_only ? plan.cpu_seconds * spec().num_layers : 0;
  size_t cpu = 0;
  for (backend::StepSequence& s : batch) {
    if (s.remote.service == nullptr) continue;
    s.sub_batch = plan.second[cpu++] ? 1 : 0;
  }
}

void AttentionOffload::ObserveCpuCosts(double round_trip_seconds_total) {
  const double observed = round_trip_seconds_total - round_trip_seconds_seen_;
  round_trip_seconds_seen_ = round_trip_seconds_total;
  if (planned_cpu_step_seconds_ <= 0) return;
  step_costs_.cpu_scale =
      UpdateCpuScale(step_costs_.cpu_scale, observed, planned_cpu_step_seconds_);
  planned_cpu_step_seconds_ = 0;
}

void AttentionOffload::BeforeStep(engine::EngineCore& core) {
  FinishMigrations(core);
  const engine::EngineStats stats = core.stats();
  ObserveCpuCosts(stats.remote_round_trip_seconds_total);
  NotePlacementsJoined(stats.remote_placed_total);
  core.NoteCpuCostScale(step_costs_.cpu_scale);
  // Placements the step-time guard refused (Decode.ReserveKv threads).
  for (int64_t held = placements_held_.exchange(0); held > 0; --held) {
    core.NoteOffloadOutcome(engine::OffloadOutcome::kHeld);
  }
  std::vector<engine::OffloadCandidate> candidates = core.OffloadCandidates();
  PoolOccupancy pool{stats.blocks_free, stats.blocks_total, stats.waiting_head_blocks};
  // The decode step (not the last planned one: that exists only once some
  // sequence is CPU-resident, and may carry a prompt chunk), grown by each
  // move made here. `longest` is the same with each sequence moved at the
  // longest context it can reach: the step-time guard must hold until the
  // end of its decode (a sequence is often chosen with part of its prompt
  // computed).
  StepShape next = SteadyDecodeShape(stats.running, stats.remote_running,
                                     stats.batch_context_tokens, stats.remote_tokens);
  StepShape longest = next;
  size_t migrating = 0;
  {
    absl::MutexLock lock(&mu_);
    migrating = migrations_.size();
    for (const auto& migration : migrations_) {
      // Its blocks are as good as free, and it as good as moved (a waiting
      // sequence takes its place here).
      const auto it = std::find_if(candidates.begin(), candidates.end(),
                                   [&](const auto& c) { return c.id == migration->candidate.id; });
      if (it == candidates.end()) continue;
      pool.blocks_free += static_cast<int32_t>(it->blocks.size());
      next.cpu_contexts.push_back(it->num_computed);
      longest.cpu_contexts.push_back(it->max_len);
      candidates.erase(it);
    }
    placement_shape_ = longest;
    placement_costs_ = step_costs_;
  }
  if (candidates.empty()) return;
  for (const OffloadChoice& choice : ChooseOffloads(candidates, pool, options_.policy)) {
    const auto candidate = std::find_if(candidates.begin(), candidates.end(),
                                        [&](const auto& c) { return c.id == choice.id; });
    Service* service = PickFor(candidate->keys);
    if (service == nullptr) return;  // None connected: everything stays here.
    const bool background = options_.background_moves && choice.rule == OffloadRule::kPoolPressure;
    if (background &&
        migrating >= static_cast<size_t>(std::max(1, options_.background_move_threads))) {
      continue;  // As many background moves at once as there are threads.
    }
    double planned = 0;
    // Each move so far lets a waiting sequence in; the rest could follow.
    const int32_t backlog = std::max(
        0, stats.waiting - static_cast<int32_t>(next.cpu_contexts.size()) + stats.remote_running);
    if (!MayMove(*candidate, next, longest, backlog, &planned)) {
      core.NoteOffloadOutcome(engine::OffloadOutcome::kHeld);
      continue;
    }
    next.cpu_contexts.push_back(candidate->num_computed);
    longest.cpu_contexts.push_back(candidate->max_len);
    if (background) {
      StartMigration(*candidate, *service, planned);
      ++migrating;
      continue;
    }
    const absl::Time start = absl::Now();
    absl::Status moved = Move(core, *candidate, *service);
    if (moved.ok()) {
      LogMove(candidate->id, candidate->num_computed, *service, absl::Now() - start, planned,
              longest.cpu_contexts.size(), /*background=*/false);
    } else {
      TRIDENT_LOG(WARNING) << "request " << candidate->id << " stays resident: " << moved;
      core.NoteOffloadOutcome(engine::OffloadOutcome::kFailed);
      pool_->NoteFailure(*service, moved);
    }
  }
}

bool AttentionOffload::MayMove(const engine::OffloadCandidate& candidate, const StepShape& next,
                               const StepShape& longest, int32_t backlog, double* planned) const {
  const double max_step = absl::ToDoubleSeconds(options_.max_step_time);
  const bool keeps_step_time =
      MoveKeepsStepTime(longest, step_costs_, options_.pipeline, candidate.max_len,
                        spec().num_layers, max_step, planned);
  return keeps_step_time &&
         (!options_.keep_throughput ||
          MoveKeepsThroughput(next, step_costs_, options_.pipeline, candidate.num_computed, backlog,
                              max_step / spec().num_layers));
}

void AttentionOffload::LogMove(const std::string& id, int32_t tokens, const Service& service,
                               absl::Duration took, double planned_step_seconds,
                               size_t cpu_resident, bool background) const {
  TRIDENT_LOG(INFO) << "moved request " << id << " (" << tokens << " tokens) to attention service "
                    << pool_->service_id(service)
                    << (background ? ", copied in the background," : "")
                    << " in " << absl::ToDoubleMilliseconds(took)
                    << " ms; planned decode step with it " << planned_step_seconds * 1e3 << " ms, "
                    << cpu_resident << " CPU-resident, CPU cost scale " << step_costs_.cpu_scale;
}

absl::Status AttentionOffload::Move(engine::EngineCore& core,
                                    const engine::OffloadCandidate& candidate, Service& service) {
  TRIDENT_ASSIGN_OR_RETURN(const v1::AdmitSequenceResponse admitted,
                           Admit(service, candidate.id, candidate.max_len, candidate.keys));
  const uint64_t handle = admitted.handle();
  transport::attention::RemoteAttention* channel = pool_->channel(service);
  absl::Status status =
      CopyKv(candidate, admitted.in_place_tokens(), *channel, handle, loop_scratch_);
  if (status.ok()) {
    status = core.MoveToRemote(candidate.id, backend::RemoteKv{channel, handle},
                               pool_->service_id(service), admitted.in_place_tokens());
  }
  if (!status.ok()) {
    pool_->ReleaseAt(service, handle).IgnoreError();
    return status;
  }
  pool_->CountSequence(service, +1);
  return absl::OkStatus();
}

void AttentionOffload::StartMigration(const engine::OffloadCandidate& candidate, Service& service,
                                      double planned_step_seconds) {
  auto migration = std::make_unique<Migration>();
  migration->candidate = candidate;
  migration->service = &service;
  migration->start = absl::Now();
  migration->planned_step_seconds = planned_step_seconds;
  migration->channel = pool_->channel(service);
  absl::MutexLock lock(&mu_);
  migrations_.push_back(std::move(migration));
}

void AttentionOffload::MigrationLoop(CopyScratch& scratch) {
  while (true) {
    Migration* m = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto unstarted = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Migration* {
        for (const auto& migration : migrations_) {
          if (!migration->started) return migration.get();
        }
        return nullptr;
      };
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || unstarted() != nullptr;
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      m = unstarted();
      m->started = true;
    }
    // Only this thread touches *m until it is done.
    absl::StatusOr<v1::AdmitSequenceResponse> admitted =
        Admit(*m->service, m->candidate.id, m->candidate.max_len, m->candidate.keys);
    absl::Status status = admitted.status();
    if (admitted.ok()) {
      m->handle = admitted->handle();
      m->admitted = true;
      m->in_place_tokens = admitted->in_place_tokens();
      status = CopyKv(m->candidate, m->in_place_tokens, *m->channel, m->handle, scratch);
    }
    {
      absl::MutexLock lock(&mu_);
      m->status = status;
      m->done = true;
    }
    if (options_.wake) options_.wake();
  }
}

void AttentionOffload::FinishMigrations(engine::EngineCore& core) {
  std::vector<std::unique_ptr<Migration>> done;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = migrations_.begin(); it != migrations_.end();) {
      if ((*it)->done) {
        done.push_back(std::move(*it));
        it = migrations_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (std::unique_ptr<Migration>& m : done) FinishMigration(core, std::move(m));
}

void AttentionOffload::FinishMigration(engine::EngineCore& core, std::unique_ptr<Migration> m) {
  const std::string& id = m->candidate.id;
  absl::Status status = m->status;
  if (status.ok()) {
    const std::vector<engine::OffloadCandidate> candidates = core.OffloadCandidates();
    const auto now = std::find_if(candidates.begin(), candidates.end(),
                                  [&](const auto& c) { return c.id == id; });
    if (now == candidates.end() || now->residency != m->candidate.residency) {
      // It finished, was aborted or lost its blocks meanwhile: the copy is
      // of no use (and may be of reused blocks).
      core.NoteOffloadOutcome(engine::OffloadOutcome::kDropped);
      pool_->QueueRelease(*m->service, m->handle);
      return;
    }
    // The tokens it decoded here meanwhile, then the move.
    status = CopyKv(*now, m->candidate.num_computed, *m->channel, m->handle, loop_scratch_);
    if (status.ok()) {
      status = core.MoveToRemote(id, backend::RemoteKv{m->channel, m->handle},
                                 pool_->service_id(*m->service), m->in_place_tokens);
    }
    if (status.ok()) {
      pool_->CountSequence(*m->service, +1);
      LogMove(id, now->num_computed, *m->service, absl::Now() - m->start, m->planned_step_seconds,
              core.stats().remote_running, /*background=*/true);
      return;
    }
  }
  TRIDENT_LOG(WARNING) << "request " << id << " stays resident: " << status;
  core.NoteOffloadOutcome(engine::OffloadOutcome::kFailed);
  if (m->admitted) pool_->QueueRelease(*m->service, m->handle);
  pool_->NoteFailure(*m->service, status);
}

absl::Status AttentionOffload::CopyKv(const engine::OffloadCandidate& candidate, int32_t first,
                                      transport::attention::RemoteAttention& channel,
                                      uint64_t handle, CopyScratch& scratch) const {
  return kv_copier_->Copy({.blocks = candidate.blocks,
                           .first = first,
                           .last = candidate.num_computed,
                           .handle = handle},
                          channel, options_.attention_timeout, scratch);
}

void AttentionOffload::OnRemoteReleased(const std::string& id, const backend::RemoteKv& remote) {
  // A retired channel's service restarted or failed: its copy is gone.
  pool_->QueueReleaseOf(remote.service, remote.handle);
}

}  // namespace trident::worker
