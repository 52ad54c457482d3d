// An attention service's KV block store: the cluster's DRAM tier of the
// prefix cache. Full blocks of KV, named by their chained keys
// (common/kv/block_hasher.h), written by workers and read back by any worker
// serving the same model. No gRPC and no transport in it: the service's
// gRPC adapter and data plane drive it; tests use a heap pool and a fake
// clock.
//
// Life of a block:
//
//   Reserve ──> reserved (memory held, unreadable) ──Write──> held (LRU)
//      │                          │ ticket released or lease over   │ evicted
//      │                          ▼                                 ▼ (unpinned,
//      │                        freed                              freed  for room)
//      └── a key held or reserved already is skipped (written once)
//
//   Lookup ──> the longest chain of held blocks from the first key, pinned
//   under a ticket (not evictable) ──Read*──> Release (or lease over).
//
//   Borrow ──> the same, pinned for a sequence of the service that attends
//   over the blocks in place (no lease: the sequence's life) ──> Return.
//
// A block's bytes: for each layer, its K then its V entries
// (KV_BLOCK_LAYOUT_HEAD_TOKEN_DIM), as the format's layout says; the store
// treats them as opaque. The store takes blocks of one format (model
// identity and shape), set by the first Reserve; another is refused
// (FAILED_PRECONDITION) so that one model's blocks never answer another's.
//
// Tickets belong to the session that took them (owner id and
// incarnation); a data-plane request names them with the owner's
// incarnation.
//
// Thread-safe. Time comes from the injected clock only.

#ifndef TRIDENT_SERVICES_ATTENTION_KV_STORE_BLOCK_STORE_H_
#define TRIDENT_SERVICES_ATTENTION_KV_STORE_BLOCK_STORE_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/kv/block_key.h"
#include "common/kv/kv_event_log.h"
#include "common/numeric/dtype.h"
#include "common/time/clock.h"
#include "services/attention/kv_store/kv_pool.h"

namespace trident::attention {

// What every block of the store holds.
struct BlockFormat {
  std::string model_identity;
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 0;
  numeric::DType dtype = numeric::DType::kBF16;

  // num_layers * 2 * num_kv_heads * block_size * head_dim elements.
  uint64_t block_bytes() const;
  std::string Describe() const;
  friend bool operator==(const BlockFormat&, const BlockFormat&) = default;
};

// INVALID_ARGUMENT naming the field: an empty or over-long identity, a
// dimension out of range (heads and block size 1..1024, head_dim 1..512,
// layers 1..1024).
absl::Status ValidateBlockFormat(const BlockFormat& format);

struct BlockStoreOptions {
  // Bytes the store's blocks may hold (its blocks come from the service's
  // KV pool, which sequences share). Zero: the store is off (every put
  // reserves nothing, every lookup matches nothing).
  int64_t capacity_bytes = 0;
  // How long a put's reservation, and a lookup's pin, last.
  absl::Duration put_lease = absl::Seconds(30);
  absl::Duration read_lease = absl::Seconds(30);
  // Keys per request.
  int32_t max_keys = 4096;
};

struct BlockStoreStats {
  int64_t blocks = 0;           // Held (readable).
  int64_t reserved_blocks = 0;  // Reserved by puts, not yet written.
  int64_t bytes = 0;            // Of held and reserved blocks.
  int64_t capacity_bytes = 0;
  int64_t pinned_blocks = 0;  // Held blocks pinned by lookups or borrows (counted once).
  int64_t borrows = 0;        // Live borrows (sequences attending in place).
  int64_t borrowed_blocks = 0;  // Held blocks they pin (counted once).
  int64_t blocks_written_total = 0;
  int64_t evictions_total = 0;
  int64_t blocks_refused_total = 0;  // Not reserved for want of room.
  int64_t lookups_total = 0;
  int64_t blocks_matched_total = 0;
  int64_t blocks_read_total = 0;
};

// Who holds a ticket.
struct BlockOwner {
  std::string owner_id;
  uint64_t incarnation = 0;
};

class BlockStore {
 public:
  // `pool` and `clock` must outlive the store.
  BlockStore(KvPool* pool, Clock* clock, BlockStoreOptions options);
  // Frees every block.
  ~BlockStore();

  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  const BlockStoreOptions& options() const { return options_; }
  // Bytes of one block of the store's format; 0 before the first put.
  uint64_t block_bytes() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return block_bytes_;
  }

  struct Reservation {
    uint64_t ticket = 0;         // 0: nothing reserved.
    std::vector<int32_t> write;  // Indices into the keys, in order.
    uint64_t block_bytes = 0;
    // Keys from this index on were refused for room; keys.size() if none.
    int32_t refused_from = 0;
  };
  // Phase one of a put: reserves a block for each key neither held nor
  // being written, in order, evicting unpinned blocks (least recently used
  // first) for room; stops at the first that does not fit (a chain's later
  // blocks are useless without it). INVALID_ARGUMENT for a bad format or
  // key count; FAILED_PRECONDITION for another format than the store's.
  absl::StatusOr<Reservation> Reserve(const BlockOwner& owner, const BlockFormat& format,
                                      absl::Span<const kv::BlockKey> keys) ABSL_LOCKS_EXCLUDED(mu_);

  // One block's copy of a Write or Read.
  struct BlockCopy {
    const char* from = nullptr;
    char* to = nullptr;
    size_t bytes = 0;
  };
  // Does every copy (in any order, on any threads) before returning.
  using CopyFn = std::function<void(absl::Span<const BlockCopy>)>;
  // Writes blocks [first, first + count) of a put's ticket from `data`
  // (count * block_bytes bytes; with `copy` as Read's) and makes them
  // readable. NOT_FOUND for an
  // unknown (released, expired) ticket or one of another incarnation;
  // INVALID_ARGUMENT for a range outside the put, a lookup's ticket, the
  // wrong byte count, or a block already written.
  absl::Status Write(uint64_t incarnation, uint64_t ticket, int32_t first, int32_t count,
                     const char* data, size_t bytes, const CopyFn& copy = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);

  struct Match {
    uint64_t ticket = 0;  // 0 when matched is 0.
    int32_t matched = 0;
    uint64_t block_bytes = 0;
  };
  // Pins the longest chain of held blocks matching `keys` from the first.
  // Errors as Reserve.
  absl::StatusOr<Match> Lookup(const BlockOwner& owner, const BlockFormat& format,
                               absl::Span<const kv::BlockKey> keys) ABSL_LOCKS_EXCLUDED(mu_);

  // Copies blocks [first, first + count) of a lookup's ticket into `out`
  // (count * block_bytes bytes), with `copy` when given (the service's
  // threads; called under the store's lock), else memcpy on this thread.
  // Errors as Write.
  absl::Status Read(uint64_t incarnation, uint64_t ticket, int32_t first, int32_t count, char* out,
                    size_t bytes, const CopyFn& copy = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  struct Borrowed {
    uint64_t ticket = 0;  // 0 when nothing matched.
    // The matched blocks' bytes, in chain order; valid until Return.
    std::vector<const char*> blocks;
  };
  // Pins the longest chain of held blocks matching `keys` from the first,
  // for reading in place until Return(ticket): no lease, not readable over
  // the data plane, not ended by ReleaseOwner or Sweep. Errors as Lookup.
  absl::StatusOr<Borrowed> Borrow(const BlockFormat& format, absl::Span<const kv::BlockKey> keys)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a borrow; false if it was not live.
  bool Return(uint64_t ticket) ABSL_LOCKS_EXCLUDED(mu_);

  // Ends a ticket: unpins a lookup's blocks, frees a put's unwritten ones.
  // False if it was not live (or is another owner's).
  bool Release(const BlockOwner& owner, uint64_t ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every ticket of `owner_id` (its session ended).
  int ReleaseOwner(const std::string& owner_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Ends tickets whose lease is over. Returns how many.
  int Sweep() ABSL_LOCKS_EXCLUDED(mu_);

  BlockStoreStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // The store's format, once its first put set it.
  std::optional<BlockFormat> format() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return format_;
  }
  // Blocks made readable (stored) and freed after being readable (removed),
  // after `*cursor` (kv::KvEventLog::ReadSince: a snapshot for 0 or a
  // cursor the log no longer reaches); advances `*cursor`.
  kv::KvEventBatch EventsSince(uint64_t* cursor) const { return events_.ReadSince(cursor); }
  // Every block held, reserved or free; pins equal the live lookups' blocks;
  // the LRU lists exactly the held blocks; bytes add up. INTERNAL naming the
  // first broken one.
  absl::Status CheckInvariants() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Block {
    kv::BlockKey key;
    KvSpan span;
    bool written = false;
    int32_t pins = 0;
    std::list<kv::BlockKey>::iterator lru;  // Valid while written.
  };
  struct Ticket {
    BlockOwner owner;
    bool put = false;
    bool borrow = false;  // A lookup's pins without a lease or an owner.
    absl::Time expires;
    std::vector<kv::BlockKey> keys;  // The put's (or lookup's) blocks, in order.
  };

  absl::Status CheckFormat(const BlockFormat& format, absl::Span<const kv::BlockKey> keys,
                           bool bind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Room for one more block: evicts the least recently used unpinned one
  // while the budget or the pool is short. False when nothing can go.
  std::optional<KvSpan> AllocateBlock() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeBlock(kv::BlockKey key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ticket, if live, of `incarnation` and of the kind asked.
  absl::StatusOr<Ticket*> FindTicket(uint64_t incarnation, uint64_t ticket, bool put,
                                     int32_t first, int32_t count, size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndTicketLocked(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pins the longest held chain of `keys` into `ticket` (Lookup, Borrow).
  void PinChain(absl::Span<const kv::BlockKey> keys, Ticket* ticket,
                std::vector<const char*>* data) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  KvPool* const pool_;
  Clock* const clock_;
  const BlockStoreOptions options_;

  mutable absl::Mutex mu_;
  std::optional<BlockFormat> format_ ABSL_GUARDED_BY(mu_);
  uint64_t block_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<kv::BlockKey, Block> blocks_ ABSL_GUARDED_BY(mu_);
  // Written blocks, least recently used first.
  std::list<kv::BlockKey> lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Ticket> tickets_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  BlockStoreStats counters_ ABSL_GUARDED_BY(mu_);
  kv::KvEventLog events_;  // Its own lock; written under mu_.
};

// Does share `part` of `parts` of a Read's copies: bytes
// [total * part / parts, total * (part + 1) / parts) of them laid end to
// end, so that `parts` threads each calling it with their own part do them
// all. REQUIRES: part < parts.
void CopyPart(absl::Span<const BlockStore::BlockCopy> copies, size_t parts, size_t part);

}  // namespace trident::attention

#endif  // TRIDENT_SERVICES_ATTENTION_KV_STORE_BLOCK_STORE_H_
