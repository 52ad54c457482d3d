#ifndef TRIDENT_COMMON_TRANSPORT_KV_FAKE_KV_MESSAGE_SINK_H_
#define TRIDENT_COMMON_TRANSPORT_KV_FAKE_KV_MESSAGE_SINK_H_

// A KvMessageSink for tests of code that receives KV messages (UcxKv,
// FakeKvReceiver): reservations live in memory, added and ended by the test,
// with no leases and no hand-off; the bytes written are counted per
// reservation, and AwaitBytes waits for them.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/transport/kv/kv_message_sink.h"

namespace trident::transport {

// Has KvMessageSink's contract: writes run without the lock, pinned; an
// ended reservation takes no more writes (NOT_FOUND). Thread-safe.
class FakeKvMessageSink final : public KvMessageSink {
 public:
  // Reservation `id` takes writes into `blocks` (token order) from now on,
  // its count starting from zero.
  void Add(uint64_t id, std::vector<int32_t> blocks) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    entries_[id] = Entry{.blocks = std::move(blocks)};
  }

  // Reservation `id` takes no more writes; its count stays readable. Writes
  // in progress finish (and count). Returns false for an unknown or ended one.
  bool End(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(id);
    if (it == entries_.end() || !it->second.open) return false;
    it->second.open = false;
    return true;
  }

  // Bytes counted for `id`; 0 for an unknown one.
  int64_t bytes(uint64_t id) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(id);
    return it == entries_.end() ? 0 : it->second.bytes;
  }

  // Writes running (WriteMessage's `write`, or begun and not yet ended).
  int writes_in_progress() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return in_progress_;
  }

  // Waits until `bytes` bytes were counted for `id` (OK) or `deadline`
  // passes (DEADLINE_EXCEEDED saying how many came). NOT_FOUND for an
  // unknown reservation, or an ended one short of `bytes`.
  absl::Status AwaitBytes(uint64_t id, int64_t bytes, absl::Time deadline) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto done = [this, id, bytes]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto it = entries_.find(id);
      return it == entries_.end() || it->second.bytes >= bytes || !it->second.open;
    };
    const bool reached = mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
    auto it = entries_.find(id);
    if (it == entries_.end()) return absl::NotFoundError(absl::StrCat("no reservation ", id));
    if (it->second.bytes >= bytes) return absl::OkStatus();
    const std::string counted = absl::StrCat(it->second.bytes, " of ", bytes, " bytes arrived");
    if (!reached) return absl::DeadlineExceededError(counted);
    return absl::NotFoundError(absl::StrCat("reservation ", id, " ended: ", counted));
  }

  absl::Status WriteMessage(
      uint64_t id,
      absl::FunctionRef<absl::StatusOr<int64_t>(absl::Span<const int32_t>)> write) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<int32_t> blocks;
    {
      absl::MutexLock lock(&mu_);
      absl::StatusOr<const Entry*> entry = OpenEntry(id);
      if (!entry.ok()) return entry.status();
      blocks = (*entry)->blocks;
      ++in_progress_;
    }
    const absl::StatusOr<int64_t> wrote = write(blocks);
    EndMessage(id, wrote);
    return wrote.status();
  }

  absl::Status BeginMessage(
      uint64_t id, absl::FunctionRef<absl::Status(absl::Span<const int32_t>)> check) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<const Entry*> entry = OpenEntry(id);
    if (!entry.ok()) return entry.status();
    if (absl::Status checked = check((*entry)->blocks); !checked.ok()) return checked;
    ++in_progress_;
    return absl::OkStatus();
  }

  void EndMessage(uint64_t id, const absl::StatusOr<int64_t>& wrote) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    --in_progress_;
    auto it = entries_.find(id);
    if (it != entries_.end() && wrote.ok()) it->second.bytes += *wrote;
  }

 private:
  struct Entry {
    std::vector<int32_t> blocks;
    int64_t bytes = 0;
    bool open = true;
  };

  absl::StatusOr<const Entry*> OpenEntry(uint64_t id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = entries_.find(id);
    if (it == entries_.end() || !it->second.open) {
      return absl::NotFoundError(absl::StrCat("reservation ", id, " takes no writes"));
    }
    return &it->second;
  }

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  int in_progress_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trident::transport

#endif  // TRIDENT_COMMON_TRANSPORT_KV_FAKE_KV_MESSAGE_SINK_H_
