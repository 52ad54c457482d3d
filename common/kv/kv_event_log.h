#ifndef TRIDENT_COMMON_KV_KV_EVENT_LOG_H_
#define TRIDENT_COMMON_KV_KV_EVENT_LOG_H_

// A worker's KV events: which block keys its prefix cache holds, as a
// numbered stream that routers follow (KV-aware routing, Dynamo's and
// vLLM's KV events). The allocator reports each key it names (stored) and
// each it evicts (removed); every event gets the next sequence number.
//
//   reader cursor c ──ReadSince──▶ events (c, last]       if the ring still holds c + 1
//                               ▶ snapshot of every key  if c == 0 (first read) or
//                                                        the ring dropped events past c
//
// A reader thus never misses an event silently: it gets the events it has
// not seen, or the whole set (snapshot: replace what you knew). The ring is
// bounded (`capacity` events); the key set is exact.
//
// Thread-safe.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "common/kv/block_key.h"

namespace trident::kv {

// One key stored (named by the cache) or removed (evicted).
struct KvEvent {
  bool stored = true;
  BlockKey key;
  friend bool operator==(const KvEvent& a, const KvEvent& b) {
    return a.stored == b.stored && a.key == b.key;
  }
};

struct KvEventBatch {
  // True: `events` stores every key held now (replace what was known).
  bool snapshot = false;
  // Sequence numbers covered: (first_seq - 1, last_seq]. A delta follows the
  // previous batch exactly when its first_seq is that batch's last_seq + 1;
  // a snapshot stands for every event up to last_seq. Empty deltas have
  // first_seq == last_seq + 1.
  uint64_t first_seq = 0;
  uint64_t last_seq = 0;
  // In sequence order (a key may be stored, removed and stored again).
  std::vector<KvEvent> events;
};

class KvEventLog {
 public:
  explicit KvEventLog(size_t capacity = size_t{1} << 16);

  KvEventLog(const KvEventLog&) = delete;
  KvEventLog& operator=(const KvEventLog&) = delete;

  void Stored(const BlockKey& key) ABSL_LOCKS_EXCLUDED(mu_);
  void Removed(const BlockKey& key) ABSL_LOCKS_EXCLUDED(mu_);

  // The events after `*cursor` (0: none seen yet), or a snapshot (see the
  // file comment); advances `*cursor` to the batch's last_seq.
  KvEventBatch ReadSince(uint64_t* cursor) const ABSL_LOCKS_EXCLUDED(mu_);

  // Keys held now, and the last sequence number.
  size_t num_keys() const ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t last_seq() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Event {
    uint64_t seq;
    KvEvent event;
  };
  void Append(bool stored, const BlockKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  mutable absl::Mutex mu_;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Event> ring_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<BlockKey> keys_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::kv

#endif  // TRIDENT_COMMON_KV_KV_EVENT_LOG_H_
