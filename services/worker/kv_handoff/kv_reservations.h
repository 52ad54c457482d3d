// The decode side of a KV hand-off (trident.v1.Decode's ReserveKv, RenewKv,
// CommitKv, ReleaseKv and the wait of a Decode call): blocks reserved with a
// lease for a prompt's KV that a prefill worker writes, then handed to the
// engine when the writer commits.
//
// Life of a reservation:
//   Reserve -> (Renew)* -> Commit(COMPLETE) -> taken by Await's callback,
//                                              which owns the blocks
//                       -> Commit(FINISHED | ABORTED) -> blocks freed; the
//                          outcome is kept (without blocks) for an Await
//                          that comes later, until the lease ends
//                       -> lease ends -> blocks freed
// Release before Commit marks it abandoned: the writer may still be writing,
// so the blocks stay out of the pool until its Commit or the lease's end.
// An Await registered before the outcome is called exactly once, with the
// outcome; one registered after a COMPLETE commit takes the blocks at once.
//
// A reservation may instead hold KV placed at a CPU attention service
// (ReserveRemote: a CPU-resident sequence whose prompt the prefill worker
// writes there): it has no blocks, and its placement is handed off as
// blocks are, or released (RemotePlacement::release) when it ends untaken.
//
// KV that arrives as messages (transport::KvWriteMode::kMessage) comes in
// through transport::KvMessageSink, which this implements: the worker
// server hands the same KvReservations to the DecodeService (the control
// plane above) and to the KV transport (common/transport/kv) below.
//
// Thread-safe. Callbacks run on the thread that causes the outcome (Commit,
// ExpireLeases, Release or Await itself), outside the lock.

#ifndef TRIDENT_SERVICES_WORKER_KV_HANDOFF_KV_RESERVATIONS_H_
#define TRIDENT_SERVICES_WORKER_KV_HANDOFF_KV_RESERVATIONS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/backend/model_backend.h"
#include "common/time/clock.h"
#include "common/transport/kv/kv_message_sink.h"
#include "trident/v1/worker.pb.h"

namespace trident::worker {

// Where reserved blocks come from (the engine's allocator).
class BlockSource {
 public:
  virtual ~BlockSource() = default;
  virtual absl::StatusOr<std::vector<int32_t>> Reserve(int32_t num_blocks) = 0;
  virtual absl::Status Free(absl::Span<const int32_t> blocks) = 0;
  // Takes a reference on the longest chain of cached blocks holding the
  // KV of `tokens`' leading whole blocks (at most `max_blocks`), for the
  // prefix cache's `cache_salt`; they are freed with Free like reserved
  // ones. None without a prefix cache.
  virtual std::vector<int32_t> AcquireCached(absl::Span<const int32_t> tokens,
                                             const std::string& cache_salt, int32_t max_blocks) {
    (void)tokens;
    (void)cache_salt;
    (void)max_blocks;
    return {};
  }
};

struct KvReservationOptions {
  int32_t block_size = 16;
  // Lease when the request names none, and the cap on what it may ask.
  absl::Duration default_lease = absl::Seconds(30);
  absl::Duration max_lease = absl::Minutes(10);
};

enum class KvOutcome { kComplete, kFinished, kAborted };

// What the writer reported with its commit.
struct KvCommit {
  KvOutcome outcome = KvOutcome::kComplete;
  // Output 0 (kComplete, kFinished).
  int32_t first_token = -1;
  float first_logprob = 0;
  // kAborted: what went wrong.
  std::string error;
  // kFinished: why the first token ended the sequence (a trident.v1.
  // FinishReason value).
  int32_t finish_reason = 0;
};

// KV at a CPU attention service, held by a reservation instead of blocks.
struct RemotePlacement {
  // The sequence there, as the engine names it.
  backend::RemoteKv kv;
  std::string service_id;
  // Frees the service's sequence; run once (under the reservations' lock:
  // it must not call back into them) when the reservation ends without
  // its hand-off being taken.
  std::function<void()> release;
};

// A placement and where its prompt's writer writes.
struct PromptPlacement {
  RemotePlacement placement;
  // Endpoint, layout, regions, cpu_resident and the service's fields;
  // num_cached_blocks says how many leading blocks the service reads in
  // place from its block store (the writer skips them).
  trident::v1::KvDestination destination;
};

// Places prompts' KV at CPU attention services (the decode worker's
// offload, AttentionOffload). Thread-safe.
class PromptPlacer {
 public:
  using PlaceDone = absl::AnyInvocable<void(absl::StatusOr<PromptPlacement>) &&>;

  virtual ~PromptPlacer() = default;
  // Whether a sequence that may reach `max_total_tokens` goes to the CPU at
  // admission (the offload's long-context rule).
  virtual bool PlacesOnCpu(int32_t max_total_tokens) const = 0;
  // Admits sequence `request_id` at a service with room for
  // `capacity_tokens` without blocking: `done` gets the placement, or the
  // service's error (RESOURCE_EXHAUSTED: its budget is full; UNAVAILABLE
  // when no service is connected), exactly once, on this thread when no
  // call is made, else on a gRPC callback thread; it must not block.
  // `prompt` (empty when the request named no token ids; read before Place
  // returns) and `cache_salt` let the service read the prompt's leading
  // blocks in place from its block store.
  virtual void Place(const std::string& request_id, int32_t num_tokens, int32_t capacity_tokens,
                     absl::Span<const int32_t> prompt, const std::string& cache_salt,
                     PlaceDone done) = 0;
};

// What Await's callback receives: the commit, and for kComplete the blocks
// or the remote placement (now the callback's to hand to the engine or
// free).
struct KvHandOff {
  KvCommit commit;
  std::vector<int32_t> blocks;
  std::optional<RemotePlacement> remote;
};

class KvReservations final : public transport::KvMessageSink {
 public:
  // `blocks` and `clock` (not owned) must outlive this.
  KvReservations(BlockSource* blocks, const Clock* clock, KvReservationOptions options);
  // Frees the blocks of every reservation still held.
  ~KvReservations() override;

  KvReservations(const KvReservations&) = delete;
  KvReservations& operator=(const KvReservations&) = delete;

  struct Reservation {
    uint64_t id = 0;
    // Every block of the prompt, in token order; the first
    // `num_cached_blocks` already hold its KV (the prefix cache's), the
    // rest are the writer's.
    std::vector<int32_t> blocks;
    int32_t num_cached_blocks = 0;
    absl::Duration lease;
    absl::Time expires;
  };
  // Reserves ceil(num_tokens / block_size) blocks. With `prompt` (its
  // num_tokens token ids), the leading whole blocks the prefix cache holds
  // (BlockSource::AcquireCached) are taken as they are and only the rest
  // reserved: message writes reach only those. INVALID_ARGUMENT for an
  // empty request id, num_tokens < 1, a prompt of another length, or a
  // lease outside (0, max] (absl::ZeroDuration() means the default; longer
  // is capped); RESOURCE_EXHAUSTED when the blocks are not free.
  absl::StatusOr<Reservation> Reserve(const std::string& request_id, int32_t num_tokens,
                                      absl::Duration lease, absl::Span<const int32_t> prompt = {},
                                      const std::string& cache_salt = "");
  // A reservation holding `placement` instead of blocks (its `blocks` are
  // empty). INVALID_ARGUMENT as Reserve; on an error `placement` is
  // released.
  absl::StatusOr<Reservation> ReserveRemote(const std::string& request_id,
                                            RemotePlacement placement, absl::Duration lease);

  // Extends the lease from now; returns the new end. NOT_FOUND for an unknown,
  // committed, or expired reservation.
  absl::StatusOr<absl::Time> Renew(uint64_t id, absl::Duration lease);

  // The writer's hand-off. NOT_FOUND for an unknown or expired reservation,
  // ALREADY_EXISTS if already committed, INVALID_ARGUMENT for a COMPLETE or
  // FINISHED commit without a first token.
  absl::Status Commit(uint64_t id, KvCommit commit);

  // Gives the reservation up (see the file comment). Returns false when it
  // was unknown, already released, or expired.
  bool Release(uint64_t id);

  // Calls `done` once with the hand-off, or with ABORTED when the writer
  // aborted, the lease ended first or the reservation was released; NOT_FOUND
  // (called at once) for an unknown reservation, FAILED_PRECONDITION when
  // another Await is already registered.
  void Await(uint64_t id, std::function<void(absl::StatusOr<KvHandOff>)> done);

  // Drops the reservations whose lease ended (freeing their blocks and
  // failing their Await). Call periodically; returns how many ended.
  int ExpireLeases();

  // A write that arrived as a message (transport::KvWriteMode::kMessage):
  // runs `write` with the reservation's blocks if it still accepts writes
  // (not committed, released or expired). `write` runs without the lock
  // (several messages copy in at once), with the reservation pinned: if it
  // is released or expires meanwhile, its blocks go back to the pool only
  // once `write` returns, so a late copy never lands in blocks given to
  // another sequence. `write` returns the bytes it wrote, or an error if the
  // write does not belong to those blocks; the bytes are counted for
  // AwaitBytes. NOT_FOUND when the reservation accepts no writes (a late
  // message is dropped). A commit hands the blocks off even while a write
  // runs: that takes a sender that sent more than its commit counts.
  absl::Status WriteMessage(
      uint64_t id,
      absl::FunctionRef<absl::StatusOr<int64_t>(absl::Span<const int32_t>)> write) override;

  // WriteMessage in two halves, for a write that completes later (a UCX
  // fetch straight into the blocks): BeginMessage checks the reservation as
  // WriteMessage does, runs `check` with its blocks under the lock (an error
  // from it is returned and nothing is pinned) and pins the reservation;
  // EndMessage unpins it and counts `wrote` bytes (an error: none). Every OK
  // BeginMessage needs exactly one EndMessage.
  absl::Status BeginMessage(
      uint64_t id, absl::FunctionRef<absl::Status(absl::Span<const int32_t>)> check) override;
  void EndMessage(uint64_t id, const absl::StatusOr<int64_t>& wrote) override;

  // Waits until `bytes` bytes of messages have arrived for reservation `id`
  // (OK), it stops accepting writes (NOT_FOUND), or `deadline` passes
  // (DEADLINE_EXCEEDED saying how many arrived). A commit's sender counts
  // bytes as sent, the receiver as copied: this closes the gap.
  absl::Status AwaitBytes(uint64_t id, int64_t bytes, absl::Time deadline);

  // AwaitBytes without blocking: `done` runs once, without the lock, with
  // what AwaitBytes would return: at once when the bytes are in or the
  // reservation accepts no writes, else from the message write that
  // completes them, from the commit, release or expiry that ends the
  // reservation (NOT_FOUND), or from the first ExpireLeases at or after
  // `deadline` (DEADLINE_EXCEEDED). FAILED_PRECONDITION (at once) when the
  // reservation already has such a waiter.
  void OnBytes(uint64_t id, int64_t bytes, absl::Time deadline,
               std::function<void(absl::Status)> done);

  // Whether reservation `id` still awaits its Decode call: known, not yet
  // taken by Await (whatever its commit's outcome), not released, not
  // expired. A released one may still hold blocks until its writer commits,
  // but no Decode will come for it.
  bool IsPending(uint64_t id) const;

  // Blocks held by live reservations (uncommitted, or committed and not yet
  // taken).
  int32_t blocks_held() const;
  int32_t num_reservations() const;

 private:
  struct Entry {
    std::string request_id;
    std::vector<int32_t> blocks;
    // Leading blocks from the prefix cache: never written.
    int32_t num_cached_blocks = 0;
    absl::Time expires;
    bool committed = false;
    bool released = false;
    // Bytes written by messages, and message writes running.
    int64_t message_bytes = 0;
    int writers = 0;
    KvCommit commit;
    std::function<void(absl::StatusOr<KvHandOff>)> waiter;
    std::optional<RemotePlacement> remote;
    // An OnBytes waiting for message bytes.
    struct BytesWait {
      int64_t bytes = 0;
      absl::Time deadline;
      std::function<void(absl::Status)> done;
    };
    std::optional<BytesWait> bytes_wait;
  };
  // Callbacks run once the lock is released (defined in the .cc).
  class Deferred;
  struct Held {
    std::vector<int32_t> blocks;
    std::optional<RemotePlacement> remote;
  };
  // The lease asked for, defaulted and capped; INVALID_ARGUMENT if negative.
  absl::StatusOr<absl::Duration> LeaseFor(absl::Duration lease) const;
  // Frees what `e` holds (blocks, remote placement).
  void FreeHeld(uint64_t id, Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes `it`, freeing what it holds unless `take`; returns what was
  // taken.
  Held Erase(uint64_t id, bool take, Deferred& deferred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `e`'s OnBytes wait, if any, with NOT_FOUND (it accepts no more
  // writes).
  static void EndBytesWait(uint64_t id, Entry& e, Deferred& deferred);

  BlockSource* const source_;
  const Clock* const clock_;
  const KvReservationOptions options_;
  mutable absl::Mutex mu_;
  // A fresh reservation id: random, non-zero, unused. Ids are the tickets
  // KV messages over UCX must name (UCX itself authenticates nobody): only
  // a peer the authenticated control plane (ReserveKv over mTLS) told one
  // can write into a reservation's blocks, and none can guess another's.
  uint64_t NewIdLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::BitGen bit_gen_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // Blocks of reservations that ended while message writes still ran into
  // them, with the number of those writes: freed when the last one returns.
  absl::flat_hash_map<uint64_t, std::pair<std::vector<int32_t>, int>> parked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_KV_HANDOFF_KV_RESERVATIONS_H_
