#include "common/engine/engine.h"

#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/kv/locked_block_allocator.h"
#include "common/kv/paged_block_allocator.h"
#include "common/kv/prefix_caching_block_allocator.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"

namespace trident::engine {

namespace {

// The pool: with prefix caching, one that reports its keys to `events`.
std::unique_ptr<kv::BlockAllocator> MakeAllocator(int32_t num_blocks, bool prefix_caching,
                                                  kv::KvEventLog* events) {
  if (!prefix_caching) return std::make_unique<kv::PagedBlockAllocator>(num_blocks);
  auto caching = std::make_unique<kv::PrefixCachingBlockAllocator>(num_blocks);
  caching->set_publish_listener([events](const kv::BlockKey& key) { events->Stored(key); });
  caching->set_eviction_listener([events](const kv::BlockKey& key) { events->Removed(key); });
  return caching;
}

}  // namespace

Engine::Engine(std::unique_ptr<backend::ModelBackend> backend, EngineOptions options)
    : backend_(std::move(backend)),
      kv_events_(options.prefix_caching ? std::make_unique<kv::KvEventLog>() : nullptr),
      allocator_(std::make_unique<kv::LockedBlockAllocator>(MakeAllocator(
          backend_->kv_capacity().num_blocks, options.prefix_caching, kv_events_.get()))),
      core_(std::make_unique<EngineCore>(backend_.get(), allocator_.get(), options)) {
  stats_ = core_->stats();
  core_->set_remote_listener([this](const std::string& id, const backend::RemoteKv& remote) {
    StepHook* hook = hook_.load(std::memory_order_acquire);
    if (hook != nullptr) hook->OnRemoteReleased(id, remote);
  });
  delivery_thread_ = std::thread([this] { DeliveryLoop(); });
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() { Shutdown(); }

absl::Status Engine::Submit(EngineRequest request, TokenCallback callback) {
  TRIDENT_RETURN_IF_ERROR(core_->Validate(request));
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the engine is shutting down");
  if (callbacks_.contains(request.id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", request.id, " is already running"));
  }
  callbacks_[request.id] = std::move(callback);
  inbox_.push_back(std::move(request));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Engine::ReserveBlocks(int32_t num_blocks) {
  return allocator_->Allocate(num_blocks);
}

std::vector<int32_t> Engine::AcquireCachedPrefix(absl::Span<const int32_t> tokens,
                                                 const std::string& cache_salt,
                                                 int32_t max_blocks) {
  if (!core_->prefix_caching() || max_blocks <= 0) return {};
  std::vector<int32_t> blocks = allocator_->AcquireCached(
      core_->hasher().PrefixKeys(cache_salt, tokens, static_cast<size_t>(max_blocks)));
  reserved_cached_blocks_.fetch_add(static_cast<int64_t>(blocks.size()));
  return blocks;
}

std::vector<int32_t> Engine::AcquireCachedKeys(absl::Span<const kv::BlockKey> keys) {
  if (!core_->prefix_caching() || keys.empty()) return {};
  return allocator_->AcquireCached(keys);
}

int32_t Engine::PublishBlocks(absl::Span<const int32_t> blocks,
                              absl::Span<const kv::BlockKey> keys) {
  if (!core_->prefix_caching()) return 0;
  int32_t named = 0;
  for (size_t i = 0; i < blocks.size() && i < keys.size(); ++i) {
    if (allocator_->Publish(blocks[i], keys[i])) ++named;
  }
  return named;
}

void Engine::Wake() {
  absl::MutexLock lock(&mu_);
  woken_ = true;
}

absl::Status Engine::FreeBlocks(absl::Span<const int32_t> blocks) {
  TRIDENT_RETURN_IF_ERROR(allocator_->Free(blocks));
  // A core short of blocks waits for these.
  absl::MutexLock lock(&mu_);
  woken_ = true;
  return absl::OkStatus();
}

absl::Status Engine::SubmitPrefilled(EngineRequest request, std::vector<int32_t> blocks,
                                     int32_t first_token, TokenCallback callback) {
  const int32_t block_size = backend_->kv_capacity().block_size;
  const size_t want = (request.prompt.size() + block_size - 1) / block_size;
  if (blocks.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("a prompt of ", request.prompt.size(),
                                                   " tokens needs ", want, " KV blocks, got ",
                                                   blocks.size()));
  }
  return QueuePrefilled({std::move(request), std::move(blocks), first_token}, std::move(callback));
}

absl::Status Engine::SubmitPrefilledRemote(EngineRequest request, backend::RemoteKv remote,
                                           std::string service_id, int32_t first_token,
                                           TokenCallback callback) {
  if (remote.service == nullptr) return absl::InvalidArgumentError("no attention service named");
  if (!backend_->supports_remote_attention()) {
    return absl::FailedPreconditionError("this backend cannot compute attention at a service");
  }
  return QueuePrefilled({std::move(request), {}, first_token, remote, std::move(service_id)},
                        std::move(callback));
}

absl::Status Engine::QueuePrefilled(Prefilled prefilled, TokenCallback callback) {
  TRIDENT_RETURN_IF_ERROR(core_->Validate(prefilled.request, prefilled.remote.service != nullptr));
  if (prefilled.first_token < 0 || prefilled.first_token >= backend_->vocab_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("first token ", prefilled.first_token, " outside the vocabulary"));
  }
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the engine is shutting down");
  if (callbacks_.contains(prefilled.request.id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request ", prefilled.request.id, " is already running"));
  }
  callbacks_[prefilled.request.id] = std::move(callback);
  prefilled_inbox_.push_back(std::move(prefilled));
  return absl::OkStatus();
}

void Engine::ReleasePrefilled(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  releases_.push_back(request_id);
}

void Engine::Abort(const std::string& request_id) {
  absl::MutexLock lock(&mu_);
  if (callbacks_.contains(request_id)) aborts_.push_back(request_id);
}

void Engine::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  // The loop's last events (the aborts of shutdown) are queued: delivered
  // before this returns.
  {
    absl::MutexLock lock(&delivery_mu_);
    loop_done_ = true;
  }
  if (delivery_thread_.joinable()) delivery_thread_.join();
}

void Engine::SetStatsObserver(std::function<void(const EngineStats&)> observer) {
  absl::MutexLock lock(&mu_);
  observer_ = std::move(observer);
  if (observer_) observer_(stats_);
}

EngineStats Engine::stats() const {
  EngineStats s;
  {
    absl::MutexLock lock(&mu_);
    s = stats_;
  }
  AddDeliveryStats(s);
  return s;
}

void Engine::AddDeliveryStats(EngineStats& s) const {
  absl::MutexLock lock(&delivery_mu_);
  s.delivered_batches_total = delivered_batches_;
  s.delivery_lag_seconds_total = delivery_lag_seconds_;
}

void Engine::Deliver(std::vector<TokenEvent> events) {
  if (events.empty()) return;
  absl::MutexLock lock(&delivery_mu_);
  deliveries_.push_back({std::move(events), std::chrono::steady_clock::now()});
}

void Engine::DeliveryLoop() {
  while (true) {
    std::vector<TokenEvent> events;
    {
      absl::MutexLock lock(&delivery_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(delivery_mu_) {
        return loop_done_ || !deliveries_.empty();
      };
      delivery_mu_.Await(absl::Condition(&ready));
      if (deliveries_.empty()) return;  // The loop is done and all is out.
      Delivery& next = deliveries_.front();
      ++delivered_batches_;
      delivery_lag_seconds_ +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - next.queued).count();
      events = std::move(next.events);
      deliveries_.pop_front();
    }
    RunCallbacks(events);
  }
}

void Engine::RunCallbacks(const std::vector<TokenEvent>& events) {
  for (const TokenEvent& ev : events) {
    TokenCallback cb;
    {
      absl::MutexLock lock(&mu_);
      auto it = callbacks_.find(ev.request_id);
      if (it == callbacks_.end()) continue;
      if (ev.finish == FinishReason::kNone) {
        cb = it->second;
      } else {
        cb = std::move(it->second);
        callbacks_.erase(it);
      }
    }
    cb(ev);
  }
}

std::optional<std::vector<TokenEvent>> Engine::StepOnce(double* seconds) {
  if (!core_->HasWork()) return std::nullopt;
  StepHook* hook = hook_.load(std::memory_order_acquire);
  core_->set_batch_planner(hook);
  if (hook != nullptr) {
    const auto hook_start = std::chrono::steady_clock::now();
    hook->BeforeStep(*core_);
    step_hook_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - hook_start).count();
  }
  const auto start = std::chrono::steady_clock::now();
  auto step = core_->Step();
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!step.ok()) {
    TRIDENT_LOG(ERROR) << "engine step failed: " << step.status();
    return std::nullopt;
  }
  return *std::move(step);
}

void Engine::HoldPublishedBlocks(int32_t max_held) {
  if (!core_->prefix_caching() || kv_events_ == nullptr) return;
  hold_max_.store(std::max(0, max_held));
}

std::vector<std::pair<kv::BlockKey, int32_t>> Engine::TakeHeldBlocks() {
  absl::MutexLock lock(&held_mu_);
  std::vector<std::pair<kv::BlockKey, int32_t>> held;
  held.swap(held_);
  return held;
}

int64_t Engine::held_blocks_dropped() const {
  absl::MutexLock lock(&held_mu_);
  return held_dropped_;
}

void Engine::HoldNewlyPublished() {
  const int32_t max_held = hold_max_.load();
  if (max_held <= 0) return;
  const kv::KvEventBatch batch = kv_events_->ReadSince(&hold_cursor_);
  size_t room;
  {
    absl::MutexLock lock(&held_mu_);
    room = static_cast<size_t>(max_held) - std::min(held_.size(), static_cast<size_t>(max_held));
  }
  std::vector<std::pair<kv::BlockKey, int32_t>> took;
  int64_t dropped = 0;
  for (const kv::KvEvent& event : batch.events) {
    if (!event.stored) continue;
    if (took.size() >= room) {
      ++dropped;
      continue;
    }
    std::vector<int32_t> block = allocator_->AcquireCached(absl::MakeConstSpan(&event.key, 1));
    if (!block.empty()) took.emplace_back(event.key, block.front());
  }
  absl::MutexLock lock(&held_mu_);
  held_.insert(held_.end(), took.begin(), took.end());
  held_dropped_ += dropped;
}

void Engine::ApplyInput(std::vector<EngineRequest>& inbox, std::vector<std::string>& aborts,
                        std::vector<Prefilled>& prefilled,
                        const std::vector<std::string>& releases, bool stopping,
                        std::vector<TokenEvent>* events) {
  for (const std::string& id : releases) core_->ReleasePrefilled(id);
  for (EngineRequest& request : inbox) {
    const std::string id = request.id;
    absl::Status status = core_->Add(std::move(request));
    if (!status.ok()) {
      // Validated at Submit; only a duplicate can land here.
      TRIDENT_LOG(WARNING) << "request " << id << " rejected: " << status;
      TokenEvent ev;
      ev.request_id = id;
      ev.finish = FinishReason::kError;
      events->push_back(ev);
    }
  }
  for (Prefilled& p : prefilled) {
    const std::string id = p.request.id;
    std::vector<int32_t> blocks = p.blocks;
    const backend::RemoteKv remote = p.remote;
    absl::Status status = core_->AddPrefilled(std::move(p.request), std::move(p.blocks),
                                              p.first_token, remote, std::move(p.service_id));
    if (!status.ok()) {
      TRIDENT_LOG(WARNING) << "prefilled request " << id << " rejected: " << status;
      TRIDENT_CHECK_OK(allocator_->Free(blocks));
      if (StepHook* hook = hook_.load(std::memory_order_acquire);
          hook != nullptr && remote.service != nullptr) {
        hook->OnRemoteReleased(id, remote);
      }
      TokenEvent ev;
      ev.request_id = id;
      ev.finish = FinishReason::kError;
      events->push_back(ev);
    }
  }
  for (const std::string& id : aborts) {
    if (core_->Abort(id)) {
      TokenEvent ev;
      ev.request_id = id;
      ev.finish = FinishReason::kAborted;
      events->push_back(ev);
    }
  }
  if (stopping) {
    absl::MutexLock lock(&mu_);
    for (auto& [id, cb] : callbacks_) {
      core_->Abort(id);
      TokenEvent ev;
      ev.request_id = id;
      ev.finish = FinishReason::kAborted;
      events->push_back(ev);
    }
  }
}

void Engine::PublishStats(bool stepped, double seconds) {
  // One walk over the sequences per iteration: the step's figures feed the
  // timing averages and the published snapshot.
  EngineStats s = core_->stats();
  if (stepped) {
    idle_checked_ = false;
    constexpr double kAlpha = 0.2;  // weight of the newest step
    auto ewma = [](double old, double sample) {
      return old == 0 ? sample : (1 - kAlpha) * old + kAlpha * sample;
    };
    if (s.last_step_prefill_tokens >= kMinRatePrefillTokens && seconds > 0) {
      // Tokens over time of recent prefill steps, each averaged apart (not
      // an average of per-step rates): a short step weighs as little as it
      // computed. Steps of fewer tokens (a prompt whose prefix was cached,
      // a decode step's companion chunk) are all fixed cost and say nothing
      // of the per-token rate, which the router reads this as: left out.
      prefill_step_tokens_ = ewma(prefill_step_tokens_, s.last_step_prefill_tokens);
      prefill_step_seconds_ = ewma(prefill_step_seconds_, seconds);
      prefill_tokens_per_second_ = prefill_step_tokens_ / prefill_step_seconds_;
    } else if (s.last_step_prefill_tokens == 0 && s.last_step_decode_sequences > 0) {
      decode_step_seconds_ = ewma(decode_step_seconds_, seconds);
    }
  }
  s.prefill_tokens_per_second = prefill_tokens_per_second_;
  s.decode_step_seconds = decode_step_seconds_;
  s.last_step_seconds = seconds;
  s.step_hook_seconds_total = step_hook_seconds_;
  s.kv_reserved_cached_blocks_total = reserved_cached_blocks_.load();
  AddDeliveryStats(s);
  // Published before the step's tokens are delivered: a caller holding a
  // request's last token sees the stats of the step that made it.
  absl::MutexLock lock(&mu_);
  stats_ = s;
  if (observer_) observer_(stats_);
}

void Engine::Loop() {
  while (true) {
    std::vector<EngineRequest> inbox;
    std::vector<std::string> aborts;
    std::vector<Prefilled> prefilled;
    std::vector<std::string> releases;
    bool stopping;
    if (!core_->HasWork() && !idle_checked_) {
      // Idle: every block is free, cached or held by a reservation or a
      // handed-over prompt; the pool's books must balance (SGLang's check).
      (void)core_->CheckKvInvariants();
      idle_checked_ = true;
    }
    {
      absl::MutexLock lock(&mu_);
      auto has_input = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !inbox_.empty() || !aborts_.empty() || !prefilled_inbox_.empty() ||
               !releases_.empty() || woken_;
      };
      // A core short of KV blocks steps again once some come back (a
      // release, an abort, FreeBlocks), work arrives, or a hook's
      // background work wakes it (Wake).
      if (!core_->HasWork() || core_->short_of_blocks()) mu_.Await(absl::Condition(&has_input));
      woken_ = false;
      inbox.swap(inbox_);
      aborts.swap(aborts_);
      prefilled.swap(prefilled_inbox_);
      releases.swap(releases_);
      stopping = stopping_;
    }
    std::vector<TokenEvent> events;
    ApplyInput(inbox, aborts, prefilled, releases, stopping, &events);
    Deliver(std::move(events));
    if (stopping) break;
    double seconds = 0;
    std::optional<std::vector<TokenEvent>> stepped = StepOnce(&seconds);
    // Before the next step can evict what this one cached.
    HoldNewlyPublished();
    PublishStats(stepped.has_value(), seconds);
    if (stepped.has_value()) Deliver(*std::move(stepped));
  }
  absl::MutexLock lock(&mu_);
  stats_ = core_->stats();
}

}  // namespace trident::engine
