// The worker's side of the DRAM tier of the prefix cache: an attention
// service's KV block store (services/attention/kv_store/block_store.h)
// behind the worker's own KV pool.
//
// Write-through: the engine holds a reference on each block its prefix
// cache names, right after the step that named it (Engine::
// HoldPublishedBlocks, at most a quarter of the pool), so no block is
// evicted or rewritten before it is copied; a writer thread takes them,
// reserves them at the store (ReserveBlocks skips keys the store holds),
// sends their bytes over the attention data plane (block puts, several in
// flight) and drops the references. The engine loop never waits for it; a
// writer that falls a quarter of the pool behind loses blocks (counted).
//
// Fetch: before a request enters the engine (TieredTokenSource below), a
// fetch thread looks the prompt's whole blocks past the worker's own cached
// prefix up in the store and, when the store holds at least
// min_fetch_blocks more and the cost model says fetching them is faster
// than computing them (bytes over the fetch bandwidth measured by the
// fetches so far, the first one always made, against tokens over the
// engine's prefill rate), reads them into blocks of the
// worker's pool and names them there; the engine then finds them as a
// prefix-cache hit. A read keeps four gets in flight, spread over the
// pool's UCX lanes, into page-locked buffers kept between fetches; a copy
// thread copies each reply into the pool while the fetch waits for the
// next. The fetched blocks stay held until the request's first
// event, so that they cannot be evicted before its admission. Nothing is
// lost when the store misses or fails: the request computes its prompt.
//
// One store per worker: the first of the pool's services whose store has a
// budget (GetStats) when the tier starts; the tier stays idle without one.
// Sequences the offload moves or places there read the blocks the store
// holds in place (AttentionOffload::EnableInPlacePrefixes).
//
// Thread-safe.

#ifndef TRIDENT_SERVICES_WORKER_KV_TIER_KV_TIER_H_
#define TRIDENT_SERVICES_WORKER_KV_TIER_KV_TIER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/backend/kv_copier.h"
#include "common/backend/model_backend.h"
#include "common/engine/engine.h"
#include "common/engine/token_source.h"
#include "common/kv/kv_event_log.h"
#include "services/worker/offload/attention_service_pool.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "trident/v1/attention.pb.h"

namespace trident::worker {

struct KvTierOptions {
  // Threads fetching blocks for arriving requests.
  int32_t fetch_threads = 2;
  // Fetch only when the store holds at least this many blocks past the
  // worker's own cached prefix.
  int32_t min_fetch_blocks = 1;
  // Fetch even when the cost model says computing is faster (tests).
  bool always_fetch = false;
  // >= 0: DramHitValue reports this instead of what was measured (tests).
  double testonly_dram_hit_value = -1;
  // How often the writer looks for newly cached blocks.
  absl::Duration write_interval = absl::Milliseconds(20);
  // Control RPCs and data-plane waits.
  absl::Duration timeout = absl::Seconds(5);
  // Bytes per block put or get message (whole blocks, at least one).
  int64_t message_bytes = int64_t{8} << 20;
};

// Totals since start.
struct KvTierStats {
  bool active = false;  // A store was found.
  int64_t lookups = 0;
  int64_t fetches = 0;  // Lookups that fetched.
  int64_t fetched_blocks = 0;
  int64_t fetched_tokens = 0;
  int64_t fetch_bytes = 0;
  double fetch_seconds = 0;
  // Of fetch_seconds: waiting for the store's replies, and copying them
  // into the KV pool (the rest: issuing the gets).
  double fetch_wait_seconds = 0;
  double fetch_copy_seconds = 0;
  int64_t skipped_fetches = 0;  // The cost model chose to compute.
  int64_t failed_fetches = 0;
  int64_t written_blocks = 0;
  int64_t write_bytes = 0;
  int64_t failed_writes = 0;
  // Cached blocks not written because the engine already held the most it
  // keeps for the writer (Engine::HoldPublishedBlocks): the writer fell
  // behind.
  int64_t dropped_writes = 0;
};

// What a fetch left for the request: blocks held until its admission, and
// the prompt tokens it brought.
struct TierFetch {
  std::vector<int32_t> held_blocks;
  int32_t fetched_tokens = 0;
};

class KvTier {
 public:
  // `pool` and `engine` must outlive the tier. INVALID_ARGUMENT without
  // prefix caching in the engine; the backend's kv_memory()/KvCopier
  // errors.
  static absl::StatusOr<std::unique_ptr<KvTier>> Create(KvTierOptions options,
                                                        AttentionServicePool* pool,
                                                        engine::Engine* engine);
  // Stops the threads (each wait is bounded by the timeout).
  ~KvTier();

  // Fetches what the store holds of `request`'s prompt past the worker's
  // cache (see the file comment), then calls `done` once, on a fetch
  // thread.
  void Prepare(const engine::EngineRequest& request, std::function<void(TierFetch)> done)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Drops a fetch's held blocks.
  void Release(TierFetch& fetch);

  KvTierStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // The block store's format this worker's blocks have.
  const trident::v1::BlockFormat& format() const { return format_; }
  // The block store's service; null when the tier is idle (none has one).
  AttentionServicePool::Service* store() const { return store_; }

  // Brings `mirror` up to the store's KV events (Attention.GetKvEvents:
  // blocks readable there, by this worker's model's keys), for the load
  // stream to relay (WorkerLoad.dram_kv_events). Call periodically, from
  // one thread, with the same log; a failed call leaves it as it was.
  void PollStoreEvents(kv::KvEventLog& mirror) ABSL_LOCKS_EXCLUDED(mu_);
  // What a prompt token held only in the store is worth here, as a share
  // of computing it (WorkerLoad.dram_hit_value): 1 - fetch time / prefill
  // time per token, 0.5 before a fetch or a prefill was measured.
  double DramHitValue() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job {
    engine::EngineRequest request;
    std::function<void(TierFetch)> done;
  };

  KvTier(KvTierOptions options, AttentionServicePool* pool, engine::Engine* engine);
  absl::Status Start();
  // The store's service, if its store has a budget; looked up once.
  AttentionServicePool::Service* FindStore();
  void WriterLoop();
  // Writes blocks the engine held for us (key, block) to the store, then
  // frees them.
  absl::Status WriteBlocks(absl::Span<const std::pair<kv::BlockKey, int32_t>> taken);
  void FetchLoop();
  TierFetch Fetch(const engine::EngineRequest& request);
  // Reads `count` blocks of lookup `ticket` into the pool's `blocks`.
  // Seconds a fetch spent waiting for replies, and copying them in (on the
  // copy thread, overlapping the waits).
  struct FetchTiming {
    double wait = 0;
    double copy = 0;
  };
  // One fetch's replies being copied into the pool on the copy thread.
  struct FetchCopies {
    absl::Mutex mu;  // Shared with the copy thread (held in CopyTask).
    std::vector<int> done_slots ABSL_GUARDED_BY(mu);  // Buffers free again.
    int outstanding ABSL_GUARDED_BY(mu) = 0;
    absl::Status status ABSL_GUARDED_BY(mu);
    double seconds ABSL_GUARDED_BY(mu) = 0;
  };
  struct CopyTask {
    const char* src = nullptr;
    absl::Span<const int32_t> blocks;
    int slot = 0;
    std::shared_ptr<FetchCopies> fetch;
  };
  // The copy thread: copies replies into the pool while their fetches
  // wait for the next ones.
  void CopyLoop();
  // Copies a reply into the pool and tells its fetch.
  void RunCopy(const CopyTask& task);
  absl::Status ReadBlocks(uint64_t ticket, absl::Span<const int32_t> blocks, uint64_t block_bytes,
                          FetchTiming* timing);
  // 1 - (fetch time / prefill time) per token, from the fetch bandwidth
  // and the engine's prefill rate measured so far (blocks of `block_bytes`);
  // none before both are measured.
  std::optional<double> FetchSaving(uint64_t block_bytes) const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether fetching beats computing (per token, so for any number of
  // blocks); true before anything was measured.
  bool FetchPays(uint64_t block_bytes) const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ReleaseTicket(uint64_t ticket);
  // The pool ranges of `block`: each layer's K and V (adjacent), in layer
  // order: a stored block's bytes.
  void BlockRanges(int32_t block, std::vector<backend::KvRange>* ranges) const;
  absl::Status CopyOut(absl::Span<const int32_t> blocks, char* dst);
  absl::Status CopyIn(const char* src, absl::Span<const int32_t> blocks);
  // Whole blocks per data-plane message.
  int32_t BlocksPerMessage(uint64_t block_bytes) const;
  // Block messages in flight at once, each way.
  static constexpr int kInFlight = 4;
  // Host buffers for block messages: page-locked for a device pool.
  struct HostSlots {
    size_t bytes = 0;  // Of each slot.
    std::vector<char*> slots;
    std::vector<std::unique_ptr<backend::HostBuffer>> pinned;
    std::deque<std::vector<char>> plain;  // Stable addresses.
  };
  HostSlots AllocateSlots(int count, size_t bytes) const;
  // A fetch's buffers: kept between fetches (page-locking them costs more
  // than a fetch's copies), allocated when none of this size is spare.
  HostSlots TakeFetchSlots(size_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  void ReturnFetchSlots(HostSlots slots) ABSL_LOCKS_EXCLUDED(mu_);

  const KvTierOptions options_;
  AttentionServicePool* const pool_;
  engine::Engine* const engine_;
  backend::KvMemory memory_;
  std::unique_ptr<backend::KvCopier> copier_;  // Device pools only.
  trident::v1::BlockFormat format_;
  AttentionServicePool::Service* store_ = nullptr;  // Set in Start.

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  KvTierStats stats_ ABSL_GUARDED_BY(mu_);
  // Fetch bandwidth measured (EWMA), bytes per second; 0 before the first.
  double fetch_bandwidth_ ABSL_GUARDED_BY(mu_) = 0;
  // Keys the store is known to hold (bounded: cleared when it grows past a
  // million); writer thread only.
  absl::flat_hash_set<kv::BlockKey> written_;
  std::deque<CopyTask> copies_ ABSL_GUARDED_BY(mu_);
  std::list<HostSlots> spare_fetch_slots_ ABSL_GUARDED_BY(mu_);
  // PollStoreEvents's view of the store: its cursor and the keys mirrored
  // (poller thread only).
  uint64_t store_cursor_ = 0;
  absl::flat_hash_set<kv::BlockKey> mirrored_;
  std::thread writer_;
  std::vector<std::thread> fetchers_;
  std::thread copy_thread_;  // Joined last: fetchers wait on its copies.
};

// The tier's metrics (trident_worker_kv_tier_*), from its totals:
//   trident_worker_kv_tier_lookups_total        counter  block-store lookups
//   trident_worker_kv_tier_fetches_total        counter  lookups that fetched blocks
//   trident_worker_kv_tier_fetched_bytes_total  counter  bytes fetched
//   trident_worker_kv_tier_fetch_seconds_total  counter  time fetching
//   trident_worker_kv_tier_skipped_total        counter  hits left to compute (cost model)
//   trident_worker_kv_tier_written_blocks_total counter  blocks written through
//   trident_worker_kv_tier_written_bytes_total  counter  bytes written through
//   trident_worker_kv_tier_fetch_stage_seconds_total{stage} counter  wait (for replies), copy
//                                                        (into the pool, overlapping the waits)
//   trident_worker_kv_tier_failures_total{op}   counter  fetch, write
//   trident_worker_kv_tier_dropped_blocks_total counter  cached blocks not written: the
//                                                        writer was a quarter of the pool behind
class KvTierMetrics {
 public:
  explicit KvTierMetrics(prometheus::Registry& registry);
  // Brings the counters up to `stats` (any thread, one at a time).
  void Sample(const KvTierStats& stats);

 private:
  prometheus::Counter& lookups_;
  prometheus::Counter& fetches_;
  prometheus::Counter& fetched_bytes_;
  prometheus::Counter& fetch_seconds_;
  prometheus::Counter& fetch_wait_seconds_;
  prometheus::Counter& fetch_copy_seconds_;
  prometheus::Counter& skipped_;
  prometheus::Counter& written_blocks_;
  prometheus::Counter& written_bytes_;
  prometheus::Counter& failed_fetches_;
  prometheus::Counter& failed_writes_;
  prometheus::Counter& dropped_writes_;
  KvTierStats last_;
};

// The engine behind a KV tier: every request is prepared by the tier (see
// KvTier) before it enters the engine, and its events carry the tokens the
// tier fetched (TokenEvent::dram_cached_tokens). Thread-safe.
class TieredTokenSource final : public engine::TokenSource {
 public:
  // Neither is owned; both must outlive this. `on_dram_hit` (may be null)
  // gets each request's tokens served by a fetch, at its first event.
  TieredTokenSource(engine::Engine* engine, KvTier* tier,
                    std::function<void(int32_t)> on_dram_hit = nullptr)
      : engine_(engine), tier_(tier), on_dram_hit_(std::move(on_dram_hit)) {}

  absl::Status Submit(engine::EngineRequest request, engine::TokenCallback callback) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void Abort(const std::string& request_id) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // A prepared request enters the engine (or ends, aborted meanwhile).
  void Enter(engine::EngineRequest request, engine::TokenCallback callback, TierFetch fetch)
      ABSL_LOCKS_EXCLUDED(mu_);

  engine::Engine* const engine_;
  KvTier* const tier_;
  const std::function<void(int32_t)> on_dram_hit_;
  absl::Mutex mu_;
  // Requests being prepared, and whether they were aborted meanwhile.
  absl::flat_hash_map<std::string, bool> preparing_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_KV_TIER_KV_TIER_H_
