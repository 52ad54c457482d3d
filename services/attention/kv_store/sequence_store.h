// The state of a CPU attention service (trident.v1.Attention), with no gRPC
// and no transport in it: its owners' sessions, the sequences they admitted
// and the KV memory each holds.
//
// Life of a session (one per owner id, i.e. per decode worker):
//
//   Connect(owner, inc) ──> open ──OwnerUnreachable(owner, inc)──> unreachable
//          ▲                  ▲                                       │
//          │                  └──── Connect(owner, inc) (same inc) ───┤
//          │                                                          │ grace ends (Sweep)
//   Connect(owner, inc') ends the old session and frees its           ▼
//   sequences (a restarted owner)                       ended: sequences freed
//
// Life of a sequence: Admit -> [Pin .. Unpin]* -> Release | its session ends
// | idle for its idle_timeout (Sweep). A sequence freed while pinned (a
// request of the data plane is computing on it) keeps its memory until the
// last Unpin.
//
// Memory layout of a sequence: one contiguous range of the pool,
//   layer l, block b: K at data + l * layer_stride_bytes + b * block_stride_bytes,
//                     V value_offset_bytes after its K,
// each of K and V num_kv_heads shares of block_size * head_dim elements of
// the sequence's dtype, ordered by `packing` (kRows: HEAD_TOKEN_DIM; kPairs:
// HEAD_VNNI_PAIRS, bf16 in blocks of a multiple of 32); block b holds tokens
// [b * block_size, (b + 1) * block_size). This is the layout
// kernels/cpu/decode_attention reads and the one AdmitSequenceResponse.layout
// publishes for writers.
//
// A sequence admitted over an in-place prefix (InPlacePrefix: full blocks
// of the block store, shared with every sequence that starts with them)
// reads its first prefix_blocks blocks there (kRows; layer l's K of prefix
// block b at prefix[b] + l * block_stride_bytes, V value_offset_bytes after
// it) and holds only the rest: its own range starts at block prefix_blocks,
// and positions in the prefix take no writes.
//
// Thread-safe. Time comes from the injected clock only.

#ifndef TRIDENT_SERVICES_ATTENTION_KV_STORE_SEQUENCE_STORE_H_
#define TRIDENT_SERVICES_ATTENTION_KV_STORE_SEQUENCE_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/numeric/dtype.h"
#include "common/time/clock.h"
#include "services/attention/kv_store/kv_pool.h"

namespace trident::attention {

struct SequenceStoreOptions {
  // How long an unreachable owner's sequences are kept for it to connect
  // again with the same incarnation.
  absl::Duration reconnect_grace = absl::Seconds(10);
  // Idle timeout of a sequence whose admission names none.
  absl::Duration default_idle_timeout = absl::Minutes(10);
};

// Element order inside a block (kernels/cpu/decode_attention's
// DecodeKvPacking); kAuto asks for the store's choice: kPairs for bf16,
// kRows otherwise.
enum class KvPacking { kAuto, kRows, kPairs };

// What AdmitSequence asks for (trident.v1.AdmitSequenceRequest, decoded).
struct SequenceSpec {
  std::string owner_id;
  uint64_t owner_incarnation = 0;
  std::string sequence_id;
  int32_t num_layers = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  numeric::DType dtype = numeric::DType::kBF16;
  int32_t capacity_tokens = 0;
  // 0: the store's choice (32 for kPairs, else 16); kPairs rounds up to a
  // multiple of 32.
  int32_t block_size = 0;
  KvPacking packing = KvPacking::kAuto;
  // Zero: the store's default.
  absl::Duration idle_timeout = absl::ZeroDuration();
};

// Where a sequence's KV is; fixed for its life.
struct SequenceLayout {
  int32_t num_layers = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  numeric::DType dtype = numeric::DType::kBF16;
  int32_t block_size = 16;
  KvPacking packing = KvPacking::kRows;  // Never kAuto.
  int32_t capacity_tokens = 0;           // Whole blocks.
  uint64_t layer_stride_bytes = 0;
  uint64_t block_stride_bytes = 0;
  uint64_t value_offset_bytes = 0;
  // Leading blocks read in place from the block store (not in the
  // sequence's own range, which holds blocks from this one on).
  int32_t prefix_blocks = 0;
};

// The full leading blocks of a sequence that another owner (the block
// store) holds, read in place. Each block holds, for every layer l, K at
// l * 2 * half then V at + half (half: num_kv_heads * block_size *
// head_dim elements), kRows.
struct InPlacePrefix {
  std::vector<const char*> blocks;
  // Called once, when the sequence's memory is freed (the borrow returned).
  std::function<void()> release;
};

// An admitted sequence, as AdmitSequence answers it.
struct AdmittedSequence {
  uint64_t handle = 0;
  // Lets a session other than the owner's (the prefill worker computing
  // the prompt) append to the sequence until the owner first attends.
  // Random, nonzero.
  uint64_t write_key = 0;
  SequenceLayout layout;
  char* data = nullptr;  // Layer 0, block 0's K.
  size_t reserved_bytes = 0;
};

// A pinned sequence, for one request of the data plane.
struct PinnedSequence {
  uint64_t handle = 0;
  const SequenceLayout* layout = nullptr;  // Valid while pinned.
  char* data = nullptr;                    // Its own range: block prefix_blocks's K of layer 0.
  const char* const* prefix = nullptr;     // layout->prefix_blocks blocks; valid while pinned.
};

// Layer `layer`'s K of block `block` of a pinned sequence, in its prefix or
// its own range. Its V is layout->value_offset_bytes after it.
const char* SequenceBlock(const PinnedSequence& s, int32_t layer, int32_t block);

struct SequenceStoreStats {
  int32_t sessions = 0;  // Open or unreachable within their grace.
  int32_t sequences = 0;
  int64_t held_bytes = 0;
  int64_t capacity_bytes = 0;
  // Tokens written, over all sequences held: each sequence counts the
  // highest position a request named plus one (its prompt, written by
  // one-sided writes, is counted when its first decode step names it).
  int64_t held_tokens = 0;
  // Frees since start, by cause.
  int64_t released = 0;
  int64_t freed_session_ended = 0;
  int64_t freed_idle = 0;
  // Sequences held over an in-place prefix, and the prefix tokens they read
  // there (each sequence counted: what copies would have held).
  int32_t in_place_sequences = 0;
  int64_t in_place_tokens = 0;
};

class SequenceStore {
 public:
  // `pool` and `clock` must outlive the store.
  SequenceStore(KvPool* pool, Clock* clock, SequenceStoreOptions options = {});
  // Frees every sequence still held (and returns their prefixes' borrows:
  // whatever they borrowed from must outlive the store).
  ~SequenceStore();

  SequenceStore(const SequenceStore&) = delete;
  SequenceStore& operator=(const SequenceStore&) = delete;

  const SequenceStoreOptions& options() const { return options_; }

  // Opens the owner's session, or confirms it (same incarnation: idempotent,
  // and it ends an unreachable state). A new incarnation for a known owner
  // ends the old session and frees its sequences, whose count is returned.
  // INVALID_ARGUMENT for an empty owner id or a zero incarnation.
  absl::StatusOr<int> Connect(const std::string& owner_id, uint64_t incarnation)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The owner's transport failed: its session ends at now + reconnect_grace
  // unless it connects again first. No effect for an unknown owner or
  // another incarnation.
  void OwnerUnreachable(const std::string& owner_id, uint64_t incarnation) ABSL_LOCKS_EXCLUDED(mu_);

  // Reserves memory for a sequence's whole capacity, less `prefix`'s
  // blocks, which it reads in place (then spec.packing must be kRows and
  // the capacity longer than the prefix; prefix.release is called when the
  // sequence is freed, or before an error returns).
  //   INVALID_ARGUMENT     a field is invalid (named).
  //   FAILED_PRECONDITION  the owner has no session, or names a stale
  //                        incarnation.
  //   ALREADY_EXISTS       the owner already has `sequence_id`.
  //   RESOURCE_EXHAUSTED   the memory budget cannot hold it (sizes named).
  absl::StatusOr<AdmittedSequence> Admit(const SequenceSpec& spec, InPlacePrefix prefix = {})
      ABSL_LOCKS_EXCLUDED(mu_);

  // Frees a sequence; returns the bytes freed, or 0 if the handle is
  // unknown (already released). FAILED_PRECONDITION as Admit. A sequence of
  // another owner is unknown to this one.
  absl::StatusOr<int64_t> Release(const std::string& owner_id, uint64_t incarnation,
                                  uint64_t handle) ABSL_LOCKS_EXCLUDED(mu_);

  // Who pins sequences, and for what (a data-plane request's header).
  struct Access {
    // The requester's incarnation: it must own every sequence, unless
    // write_key is set.
    uint64_t owner_incarnation = 0;
    // Nonzero: a prompt write, allowed on sequences with this write key
    // whose owner has not attended yet, whoever sends it.
    uint64_t write_key = 0;
    // An attention request (not append-only): from then on the sequence
    // takes no prompt writes.
    bool attends = false;
  };
  // Pins the sequences a data-plane request names, for `access`, and notes
  // that each now holds `positions[i] + 1` tokens and was used now. All or
  // none:
  //   NOT_FOUND            a handle is unknown (freed, or never admitted).
  //   FAILED_PRECONDITION  a handle belongs to another owner incarnation;
  //                        a prompt write with the wrong key, or after the
  //                        owner attended.
  //   OUT_OF_RANGE         a position is negative, past the capacity, or
  //                        in an in-place prefix (read-only).
  // REQUIRES: out.size() == handles.size() == positions.size(); every
  // successful Pin is matched by one Unpin of the same handles.
  absl::Status Pin(const Access& access, absl::Span<const uint64_t> handles,
                   absl::Span<const int32_t> positions, absl::Span<PinnedSequence> out)
      ABSL_LOCKS_EXCLUDED(mu_);
  void Unpin(absl::Span<const uint64_t> handles) ABSL_LOCKS_EXCLUDED(mu_);

  // Ends sessions whose grace has passed and frees sequences idle past their
  // timeout. Returns the number of sequences freed.
  int Sweep() ABSL_LOCKS_EXCLUDED(mu_);

  SequenceStoreStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);

  // OK if the owner has a session of this incarnation; FAILED_PRECONDITION
  // as Admit otherwise.
  absl::Status CheckOwner(const std::string& owner_id, uint64_t incarnation) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // Owners with a session, and their sequences' handles (for status pages
  // and tests).
  std::vector<uint64_t> HandlesOf(const std::string& owner_id) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Sequence {
    uint64_t handle = 0;
    std::string owner_id;
    uint64_t owner_incarnation = 0;
    std::string sequence_id;
    SequenceLayout layout;
    KvSpan span;
    int32_t tokens = 0;
    absl::Time last_used;
    absl::Duration idle_timeout;
    int pins = 0;
    bool freed = false;  // Freed while pinned: memory goes at the last Unpin.
    uint64_t write_key = 0;
    bool attended = false;  // No more prompt writes.
    InPlacePrefix prefix;
  };
  struct Session {
    uint64_t incarnation = 0;
    // Set while unreachable: when the session ends.
    absl::Time ends_at = absl::InfiniteFuture();
    absl::flat_hash_map<std::string, uint64_t> handles_by_sequence_id;
  };
  enum class FreeCause { kReleased, kSessionEnded, kIdle };

  absl::Status CheckSession(const std::string& owner_id, uint64_t incarnation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<AdmittedSequence> AdmitLayout(const SequenceSpec& spec,
                                               const SequenceLayout& layout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Frees a sequence's memory (and returns its prefix's borrow) and drops it.
  void EraseLocked(absl::flat_hash_map<uint64_t, std::unique_ptr<Sequence>>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees (or marks, if pinned) one sequence; returns its bytes.
  int64_t FreeLocked(uint64_t handle, FreeCause cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees every sequence of a session and drops it; returns the count.
  int EndSessionLocked(const std::string& owner_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  KvPool* const pool_;
  Clock* const clock_;
  const SequenceStoreOptions options_;

  mutable absl::Mutex mu_;
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  absl::BitGen keys_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  // Every sequence with memory, freed-while-pinned ones included.
  absl::flat_hash_map<uint64_t, std::unique_ptr<Sequence>> sequences_ ABSL_GUARDED_BY(mu_);
  int64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t released_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t freed_session_ended_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t freed_idle_ ABSL_GUARDED_BY(mu_) = 0;
};

// Validates a spec's shape fields and computes its layout (without memory):
// INVALID_ARGUMENT naming the field.
absl::StatusOr<SequenceLayout> LayoutFor(const SequenceSpec& spec);

// Bytes of a layout: num_layers * layer_stride_bytes.
uint64_t LayoutBytes(const SequenceLayout& layout);

}  // namespace trident::attention

#endif  // TRIDENT_SERVICES_ATTENTION_KV_STORE_SEQUENCE_STORE_H_
