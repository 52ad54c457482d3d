#ifndef TRIDENT_SERVICES_ROUTER_KV_INDEX_KV_INDEX_H_
#define TRIDENT_SERVICES_ROUTER_KV_INDEX_KV_INDEX_H_

// What a router knows of its workers' prefix caches, kept from their KV
// events (WorkerLoad.kv_events, kv::KvEventLog on the worker): per worker,
// the block keys its cache holds, so that admission can price each
// candidate's prefill at the tokens it lacks (KV-aware routing).
//
//   per worker:  incarnation, last sequence number, synced?, identity, keys
//
//   Apply(batch):  another incarnation      -> forget the worker's keys first
//                  snapshot                  -> replace its keys; synced
//                  delta following last_seq  -> apply stored/removed in order
//                  delta after a gap         -> forget its keys, unsynced
//                                               (DATA_LOSS) until a snapshot
//
// A worker's stream starts with a snapshot, and repeats one every so often,
// so a restarted worker (new incarnation) or router (new streams) converges
// on the workers' true contents, and so does one that saw a gap. A worker
// whose stream ends is forgotten (RemoveWorker).
//
// A worker with a DRAM tier also relays its store's events
// (WorkerLoad.dram_kv_events), applied as source DramSource(worker), and
// what a token found only there is worth to it (SetDramHitValue): Match
// prices the store's hits beyond the worker's own in cached-token
// equivalents.
//
// Lookups compute the prompt's keys once per distinct (cache identity,
// block size) among the workers (kv::BlockHasher, the workers' own key
// function), outside the lock, then walk each worker's set until its first
// miss.
//
// Thread-safe.

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/kv/block_key.h"
#include "trident/v1/cluster.pb.h"

namespace trident::router::kv_index {

struct KvIndexStats {
  int32_t workers = 0;  // Sources: workers' caches and their DRAM tiers.
  int64_t keys = 0;
  int64_t events_total = 0;
  int64_t snapshots_total = 0;
  int64_t gaps_total = 0;
};

class KvIndex {
 public:
  // Applies one batch of `worker_id`'s events. DATA_LOSS for a delta that
  // does not follow the last batch (the worker's keys are forgotten until
  // its next snapshot); INVALID_ARGUMENT (nothing applied) for key arrays of
  // different lengths or a block size below 1.
  absl::Status Apply(const std::string& worker_id, uint64_t incarnation,
                     const trident::v1::KvEvents& events) ABSL_LOCKS_EXCLUDED(mu_);

  // Forgets a worker (its stream ended), its DRAM source too. No-op for an
  // unknown one.
  void RemoveWorker(const std::string& worker_id) ABSL_LOCKS_EXCLUDED(mu_);

  // The source name of a worker's DRAM tier (Apply its dram_kv_events
  // under it).
  static std::string DramSource(const std::string& worker_id) { return worker_id + "/dram"; }
  // WorkerLoad.dram_hit_value of the worker (clamped to [0, 1]; NaN is 0).
  void SetDramHitValue(const std::string& worker_id, double value) ABSL_LOCKS_EXCLUDED(mu_);

  struct PrefixMatch {
    // CachedPrefixTokens of the workers' own caches, by worker id.
    absl::flat_hash_map<std::string, int64_t> gpu;
    // What each worker's DRAM tier holds of the prompt beyond `gpu`, times
    // its hit value (cached-token equivalents), by worker id; workers
    // gaining nothing left out.
    absl::flat_hash_map<std::string, int64_t> dram;
  };
  PrefixMatch Match(absl::Span<const int32_t> prompt, const std::string& cache_salt) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // For each synced worker, the leading tokens of `prompt` whose KV its
  // cache holds (whole blocks, in `cache_salt`'s namespace); workers
  // holding none are left out.
  absl::flat_hash_map<std::string, int64_t> CachedPrefixTokens(absl::Span<const int32_t> prompt,
                                                               const std::string& cache_salt) const
      ABSL_LOCKS_EXCLUDED(mu_);

  KvIndexStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Source {
    uint64_t incarnation = 0;
    uint64_t last_seq = 0;
    bool synced = false;
    std::string cache_identity;
    int32_t block_size = 0;
    absl::flat_hash_set<kv::BlockKey> keys;
  };

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Source> sources_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, double> dram_hit_values_ ABSL_GUARDED_BY(mu_);
  int64_t events_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t snapshots_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t gaps_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trident::router::kv_index

#endif  // TRIDENT_SERVICES_ROUTER_KV_INDEX_KV_INDEX_H_
