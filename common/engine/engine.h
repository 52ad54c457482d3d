// The threaded shell around EngineCore: one loop thread owns the core and
// the backend; other threads submit and abort requests and receive their
// tokens through callbacks. The callbacks run on the engine's delivery
// thread, one at a time and in the order the loop made the events, so a
// step's tokens are streamed out while the next step runs; they must not
// block (they hold up every other request's tokens).

#ifndef TRIDENT_COMMON_ENGINE_ENGINE_H_
#define TRIDENT_COMMON_ENGINE_ENGINE_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/backend/model_backend.h"
#include "common/engine/engine_core.h"
#include "common/engine/token_source.h"
#include "common/kv/block_allocator.h"
#include "common/kv/kv_event_log.h"

namespace trident::engine {

// Work the engine's owner does on the loop thread around steps: NEO-style
// offload moves sequences to attention services before a step, and
// releases their service copies when the engine no longer needs them.
// It may also plan each batch's pipelining (BatchPlanner; by default every
// batch runs as one).
class StepHook : public BatchPlanner {
 public:
  ~StepHook() override = default;
  void PlanBatch(absl::Span<backend::StepSequence> batch) override { (void)batch; }
  // Before each step that has work, with the core (not thread-safe: only
  // here may the hook touch it).
  virtual void BeforeStep(EngineCore& core) = 0;
  // A CPU-resident sequence's service copy is no longer needed (it
  // finished, was aborted, or its service failed).
  virtual void OnRemoteReleased(const std::string& id, const backend::RemoteKv& remote) = 0;
};

// Prompt tokens a step must compute to count in
// EngineStats::prefill_tokens_per_second.
inline constexpr int64_t kMinRatePrefillTokens = 64;

class Engine final : public TokenSource {
 public:
  Engine(std::unique_ptr<backend::ModelBackend> backend, EngineOptions options);
  // Stops the loop; requests still live receive a kAborted event.
  ~Engine() override;

  // Queues a request. Errors (INVALID_ARGUMENT from validation,
  // ALREADY_EXISTS, UNAVAILABLE after Shutdown) are returned at once and the
  // callback is never called; otherwise the callback receives every token
  // and exactly one finishing event.
  absl::Status Submit(EngineRequest request, TokenCallback callback) override;

  // Ends a request: its callback receives a final kAborted event (unless it
  // already finished). Safe from any thread, idempotent.
  void Abort(const std::string& request_id) override;

  // Disaggregated decode. ReserveBlocks takes `num_blocks` KV blocks for a
  // sequence whose prompt KV another worker will write (RESOURCE_EXHAUSTED
  // when fewer are free); FreeBlocks returns reserved blocks nobody used,
  // and wakes a loop whose sequences wait for blocks.
  // Both are safe from any thread.
  absl::StatusOr<std::vector<int32_t>> ReserveBlocks(int32_t num_blocks);
  // Prefix caching: takes a reference on the longest chain of cached blocks
  // holding the KV of `tokens`' leading whole blocks (at most `max_blocks`)
  // in `cache_salt`'s namespace, for a reservation; FreeBlocks returns
  // them. Empty when prefix caching is off. Safe from any thread.
  std::vector<int32_t> AcquireCachedPrefix(absl::Span<const int32_t> tokens,
                                           const std::string& cache_salt, int32_t max_blocks);
  absl::Status FreeBlocks(absl::Span<const int32_t> blocks);
  // The KV tier (services/worker/kv_tier). AcquireCachedKeys takes a
  // reference on the longest chain of cached blocks matching `keys` from
  // the first (FreeBlocks returns them); PublishBlocks names blocks the
  // caller holds (from ReserveBlocks) and has written whole KV into, so
  // that requests reuse them, and returns how many it named (a key cached
  // already leaves its block unnamed). Both are no-ops without prefix
  // caching. Safe from any thread.
  std::vector<int32_t> AcquireCachedKeys(absl::Span<const kv::BlockKey> keys);
  int32_t PublishBlocks(absl::Span<const int32_t> blocks, absl::Span<const kv::BlockKey> keys);
  // The KV tier's write-through: from now on the loop takes a reference on
  // each block the prefix cache names, after the step that named it and
  // before the next can evict it, keeping at most `max_held` at a time
  // (beyond, blocks are not held and counted in held_blocks_dropped);
  // TakeHeldBlocks hands them over, references and all (FreeBlocks them
  // once copied). No-op without prefix caching. Safe from any thread.
  void HoldPublishedBlocks(int32_t max_held);
  std::vector<std::pair<kv::BlockKey, int32_t>> TakeHeldBlocks();
  int64_t held_blocks_dropped() const;
  // Wakes a loop that waits for blocks, so that it steps (and calls its
  // StepHook) again: for a hook whose background work has finished. Safe
  // from any thread.
  void Wake();

  // Queues a sequence whose prompt KV is in `blocks` (from ReserveBlocks)
  // and whose output 0 is `first_token`; the callback then receives outputs
  // 1, 2, ... (EngineCore::AddPrefilled). The blocks belong to the engine
  // once this returns OK; on an error they stay the caller's. If the loop
  // later refuses it (a duplicate id), the callback gets one kError event
  // and the engine frees the blocks.
  absl::Status SubmitPrefilled(EngineRequest request, std::vector<int32_t> blocks,
                               int32_t first_token, TokenCallback callback);
  // The same for a sequence whose prompt KV is at an attention service
  // (`remote`, from its owner's admission there): it runs CPU-resident.
  // If the loop refuses it, the step hook's OnRemoteReleased gets it back.
  absl::Status SubmitPrefilledRemote(EngineRequest request, backend::RemoteKv remote,
                                     std::string service_id, int32_t first_token,
                                     TokenCallback callback);

  // Disaggregated prefill: frees the blocks a kPrefilled event handed over
  // (after their KV has been sent). Safe from any thread.
  void ReleasePrefilled(const std::string& request_id);

  // Aborts everything and stops the loop thread. Idempotent.
  void Shutdown();

  EngineStats stats() const;
  const backend::ModelBackend& backend() const { return *backend_; }
  // The prefix cache's KV events (what its blocks hold, for routers); null
  // with prefix caching off. Thread-safe.
  const kv::KvEventLog* kv_events() const { return kv_events_.get(); }
  // What the prefix cache's keys are computed over (kv::BlockHasher).
  const kv::BlockHasher& cache_hasher() const { return core_->hasher(); }

  // For setting the backend up before work needs it (e.g. the remote
  // attention timeout, before SetStepHook): the loop thread owns it after.
  backend::ModelBackend& backend_for_setup() { return *backend_; }

  // Called on the loop thread with fresh stats after every iteration (for
  // metrics); must be quick.
  void SetStatsObserver(std::function<void(const EngineStats&)> observer);
  // Installs (or, with null, removes) the step hook. Thread-safe; the hook
  // must stay valid until it is removed or the engine shut down.
  void SetStepHook(StepHook* hook) { hook_.store(hook, std::memory_order_release); }

 private:
  void Loop();
  // The hook's BeforeStep, then a step when the core has work; its events,
  // or nullopt when none ran (or it failed). *seconds: the step's duration.
  std::optional<std::vector<TokenEvent>> StepOnce(double* seconds);
  // Hands events to the delivery thread (nothing when empty).
  void Deliver(std::vector<TokenEvent> events) ABSL_LOCKS_EXCLUDED(delivery_mu_);
  // The delivery thread: runs the queued events' callbacks until Shutdown
  // has stopped the loop and the queue is empty.
  void DeliveryLoop() ABSL_LOCKS_EXCLUDED(delivery_mu_);
  void RunCallbacks(const std::vector<TokenEvent>& events) ABSL_LOCKS_EXCLUDED(mu_);
  // The delivery counters into `s`.
  void AddDeliveryStats(EngineStats& s) const ABSL_LOCKS_EXCLUDED(delivery_mu_);

  std::unique_ptr<backend::ModelBackend> backend_;
  // Before the allocator, which reports to it.
  std::unique_ptr<kv::KvEventLog> kv_events_;
  std::unique_ptr<kv::BlockAllocator> allocator_;
  // Touched only by the loop thread after construction (Validate is const).
  std::unique_ptr<EngineCore> core_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<EngineRequest> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> aborts_ ABSL_GUARDED_BY(mu_);
  struct Prefilled {
    EngineRequest request;
    std::vector<int32_t> blocks;
    int32_t first_token = 0;
    backend::RemoteKv remote;
    std::string service_id;
  };
  // SubmitPrefilled's checks after the block count, and the queueing.
  absl::Status QueuePrefilled(Prefilled prefilled, TokenCallback callback) ABSL_LOCKS_EXCLUDED(mu_);
  // Loop's parts: the input taken from the inbox applied to the core (its
  // refusals and aborts as events), and the stats after a step.
  void ApplyInput(std::vector<EngineRequest>& inbox, std::vector<std::string>& aborts,
                  std::vector<Prefilled>& prefilled, const std::vector<std::string>& releases,
                  bool stopping, std::vector<TokenEvent>* events);
  void PublishStats(bool stepped, double seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // HoldPublishedBlocks's work, after each step (loop thread).
  void HoldNewlyPublished() ABSL_LOCKS_EXCLUDED(held_mu_);
  std::vector<Prefilled> prefilled_inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> releases_ ABSL_GUARDED_BY(mu_);
  // FreeBlocks returned blocks, or Wake was called, since the loop last
  // looked.
  bool woken_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<std::string, TokenCallback> callbacks_ ABSL_GUARDED_BY(mu_);
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
  std::function<void(const EngineStats&)> observer_ ABSL_GUARDED_BY(mu_);
  // Step timing, touched only by the loop thread.
  double prefill_tokens_per_second_ = 0;
  double prefill_step_tokens_ = 0;
  double prefill_step_seconds_ = 0;
  double decode_step_seconds_ = 0;
  double step_hook_seconds_ = 0;
  // AcquireCachedPrefix's blocks, for the stats.
  std::atomic<int64_t> reserved_cached_blocks_{0};
  // The allocator's invariants were checked since the core last had work.
  bool idle_checked_ = false;
  std::atomic<StepHook*> hook_{nullptr};
  // HoldPublishedBlocks: the bound (0: off), the loop's cursor in the KV
  // events, and the blocks held for the taker.
  std::atomic<int32_t> hold_max_{0};
  uint64_t hold_cursor_ = 0;
  mutable absl::Mutex held_mu_;
  std::vector<std::pair<kv::BlockKey, int32_t>> held_ ABSL_GUARDED_BY(held_mu_);
  int64_t held_dropped_ ABSL_GUARDED_BY(held_mu_) = 0;
  // Events the loop made, not yet given to their callbacks.
  struct Delivery {
    std::vector<TokenEvent> events;
    std::chrono::steady_clock::time_point queued;
  };
  mutable absl::Mutex delivery_mu_;
  std::deque<Delivery> deliveries_ ABSL_GUARDED_BY(delivery_mu_);
  int64_t delivered_batches_ ABSL_GUARDED_BY(delivery_mu_) = 0;
  double delivery_lag_seconds_ ABSL_GUARDED_BY(delivery_mu_) = 0;
  bool loop_done_ ABSL_GUARDED_BY(delivery_mu_) = false;
  // Started before the loop thread, joined after it.
  std::thread delivery_thread_;
  std::thread thread_;
};

}  // namespace trident::engine

#endif  // TRIDENT_COMMON_ENGINE_ENGINE_H_
