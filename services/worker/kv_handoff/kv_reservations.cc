#include "services/worker/kv_handoff/kv_reservations.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"

namespace trident::worker {
namespace {

using Waiter = std::function<void(absl::StatusOr<KvHandOff>)>;

// Callbacks collected under the lock and run after it is released.

// What a waiter receives for a FINISHED or ABORTED commit.
absl::StatusOr<KvHandOff> OutcomeFor(KvCommit commit) {
  if (commit.outcome == KvOutcome::kAborted) {
    return absl::AbortedError(
        absl::StrCat("the prefill side aborted the KV transfer: ", commit.error));
  }
  return KvHandOff{std::move(commit), {}};
}

}  // namespace

// Declared before the lock it outlives in every method, so that the
// callbacks it holds run once the lock is released.
class KvReservations::Deferred {
 public:
  void Add(Waiter waiter, absl::StatusOr<KvHandOff> result) {
    if (waiter) calls_.emplace_back(std::move(waiter), std::move(result));
  }
  void AddBytes(std::function<void(absl::Status)> done, absl::Status status) {
    if (done) bytes_.emplace_back(std::move(done), std::move(status));
  }
  ~Deferred() {
    for (auto& [waiter, result] : calls_) waiter(std::move(result));
    for (auto& [done, status] : bytes_) done(std::move(status));
  }

 private:
  std::vector<std::pair<Waiter, absl::StatusOr<KvHandOff>>> calls_;
  std::vector<std::pair<std::function<void(absl::Status)>, absl::Status>> bytes_;
};

void KvReservations::EndBytesWait(uint64_t id, Entry& e, Deferred& deferred) {
  if (!e.bytes_wait.has_value()) return;
  deferred.AddBytes(std::move(e.bytes_wait->done),
                    absl::NotFoundError(absl::StrCat(
                        "reservation ", id, " is unknown, committed, released or expired")));
  e.bytes_wait.reset();
}

KvReservations::KvReservations(BlockSource* blocks, const Clock* clock,
                               KvReservationOptions options)
    : source_(blocks), clock_(clock), options_(options) {}

KvReservations::~KvReservations() {
  Deferred deferred;
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> ids;
  for (const auto& [id, entry] : entries_) ids.push_back(id);
  for (uint64_t id : ids) {
    Waiter waiter = std::move(entries_[id].waiter);
    Erase(id, /*take=*/false, deferred);
    deferred.Add(std::move(waiter), absl::UnavailableError("the worker is shutting down"));
  }
}

void KvReservations::FreeHeld(uint64_t id, Entry& e) {
  if (!e.blocks.empty()) {
    if (absl::Status s = source_->Free(e.blocks); !s.ok()) {
      TRIDENT_LOG(ERROR) << "freeing reservation " << id << "'s blocks: " << s;
    }
    e.blocks.clear();
  }
  if (e.remote.has_value()) {
    if (e.remote->release) e.remote->release();
    e.remote.reset();
  }
}

KvReservations::Held KvReservations::Erase(uint64_t id, bool take, Deferred& deferred) {
  auto it = entries_.find(id);
  Entry& e = it->second;
  EndBytesWait(id, e, deferred);
  Held held;
  if (take) {
    held = Held{std::move(e.blocks), std::move(e.remote)};
  } else if (e.writers > 0) {
    // Message writes still copy into the blocks: free them after the last.
    parked_[id] = {std::move(e.blocks), e.writers};
    e.blocks.clear();
    FreeHeld(id, e);
  } else {
    FreeHeld(id, e);
  }
  entries_.erase(it);
  return held;
}

absl::StatusOr<absl::Duration> KvReservations::LeaseFor(absl::Duration lease) const {
  if (lease < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("lease ", absl::FormatDuration(lease), " is negative"));
  }
  if (lease == absl::ZeroDuration()) lease = options_.default_lease;
  return std::min(lease, options_.max_lease);
}

absl::StatusOr<KvReservations::Reservation> KvReservations::Reserve(
    const std::string& request_id, int32_t num_tokens, absl::Duration lease,
    absl::Span<const int32_t> prompt, const std::string& cache_salt) {
  if (request_id.empty()) return absl::InvalidArgumentError("request_id must not be empty");
  if (num_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_tokens is ", num_tokens, "; want >= 1"));
  }
  if (!prompt.empty() && static_cast<int32_t>(prompt.size()) != num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", prompt.size(),
                                                   " tokens but num_tokens is ", num_tokens));
  }
  TRIDENT_ASSIGN_OR_RETURN(lease, LeaseFor(lease));
  const int32_t num_blocks = (num_tokens + options_.block_size - 1) / options_.block_size;
  std::vector<int32_t> blocks;
  if (!prompt.empty()) {
    blocks = source_->AcquireCached(prompt, cache_salt, num_tokens / options_.block_size);
  }
  const int32_t num_cached = static_cast<int32_t>(blocks.size());
  auto fresh = source_->Reserve(num_blocks - num_cached);
  if (!fresh.ok()) {
    if (!blocks.empty()) TRIDENT_CHECK_OK(source_->Free(blocks));
    return absl::ResourceExhaustedError(absl::StrCat("no room for ", num_blocks - num_cached,
                                                     " KV blocks: ", fresh.status().message()));
  }
  blocks.insert(blocks.end(), fresh->begin(), fresh->end());
  absl::MutexLock lock(&mu_);
  Reservation r;
  r.id = NewIdLocked();
  r.blocks = blocks;
  r.num_cached_blocks = num_cached;
  r.lease = lease;
  r.expires = clock_->Now() + lease;
  Entry& e = entries_[r.id];
  e.request_id = request_id;
  e.blocks = std::move(blocks);
  e.num_cached_blocks = num_cached;
  e.expires = r.expires;
  return r;
}

uint64_t KvReservations::NewIdLocked() {
  while (true) {
    const uint64_t id = absl::Uniform<uint64_t>(bit_gen_);
    if (id != 0 && !entries_.contains(id) && !parked_.contains(id)) return id;
  }
}

absl::StatusOr<KvReservations::Reservation> KvReservations::ReserveRemote(
    const std::string& request_id, RemotePlacement placement, absl::Duration lease) {
  absl::StatusOr<absl::Duration> granted = LeaseFor(lease);
  if (request_id.empty() || !granted.ok()) {
    if (placement.release) placement.release();
    return request_id.empty() ? absl::InvalidArgumentError("request_id must not be empty")
                              : granted.status();
  }
  absl::MutexLock lock(&mu_);
  Reservation r;
  r.id = NewIdLocked();
  r.lease = *granted;
  r.expires = clock_->Now() + r.lease;
  Entry& e = entries_[r.id];
  e.request_id = request_id;
  e.remote = std::move(placement);
  e.expires = r.expires;
  return r;
}

absl::StatusOr<absl::Time> KvReservations::Renew(uint64_t id, absl::Duration lease) {
  TRIDENT_ASSIGN_OR_RETURN(lease, LeaseFor(lease));
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  const absl::Time now = clock_->Now();
  if (it == entries_.end() || it->second.committed || it->second.expires <= now) {
    return absl::NotFoundError(
        absl::StrCat("reservation ", id, " is unknown, committed or expired"));
  }
  it->second.expires = now + lease;
  return it->second.expires;
}

absl::Status KvReservations::Commit(uint64_t id, KvCommit commit) {
  if (commit.outcome != KvOutcome::kAborted && commit.first_token < 0) {
    return absl::InvalidArgumentError("first_token is required unless the outcome is ABORTED");
  }
  Deferred deferred;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("reservation ", id, " is unknown or expired"));
  }
  Entry& e = it->second;
  if (e.committed) {
    return absl::AlreadyExistsError(absl::StrCat("reservation ", id, " is already committed"));
  }
  if (e.expires <= clock_->Now()) {
    Waiter waiter = std::move(e.waiter);
    Erase(id, /*take=*/false, deferred);
    deferred.Add(std::move(waiter),
                 absl::AbortedError(absl::StrCat("the lease of reservation ", id,
                                                 " ended before the KV was committed")));
    return absl::NotFoundError(absl::StrCat("reservation ", id, " expired"));
  }
  if (e.released) {
    // Nobody will decode it: free the blocks now.
    Erase(id, /*take=*/false, deferred);
    return absl::OkStatus();
  }
  if (commit.outcome != KvOutcome::kComplete) {
    // The KV is not needed: free the blocks. A waiting decode learns the
    // outcome now; one that arrives later finds it in the entry, which stays
    // (without blocks) until then or the lease's end.
    FreeHeld(id, e);
    if (e.waiter) {
      Waiter waiter = std::move(e.waiter);
      EndBytesWait(id, e, deferred);
      entries_.erase(it);
      deferred.Add(std::move(waiter), OutcomeFor(std::move(commit)));
      return absl::OkStatus();
    }
    e.committed = true;
    e.commit = std::move(commit);
    EndBytesWait(id, e, deferred);
    return absl::OkStatus();
  }
  if (e.waiter) {
    Waiter waiter = std::move(e.waiter);
    Held held = Erase(id, /*take=*/true, deferred);
    deferred.Add(std::move(waiter),
                 KvHandOff{std::move(commit), std::move(held.blocks), std::move(held.remote)});
    return absl::OkStatus();
  }
  e.committed = true;
  e.commit = std::move(commit);
  EndBytesWait(id, e, deferred);
  return absl::OkStatus();
}

bool KvReservations::Release(uint64_t id) {
  Deferred deferred;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.released) return false;
  Entry& e = it->second;
  if (e.committed) {
    // The writer is done and nobody took the blocks: free them.
    Erase(id, /*take=*/false, deferred);
    return true;
  }
  // The writer may still be writing: keep the blocks until its commit or the
  // lease's end.
  e.released = true;
  EndBytesWait(id, e, deferred);
  deferred.Add(std::move(e.waiter),
               absl::AbortedError(absl::StrCat("reservation ", id, " was released")));
  e.waiter = nullptr;
  return true;
}

void KvReservations::Await(uint64_t id, Waiter done) {
  Deferred deferred;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    deferred.Add(std::move(done),
                 absl::NotFoundError(absl::StrCat("reservation ", id, " is unknown or expired")));
    return;
  }
  Entry& e = it->second;
  if (e.waiter) {
    deferred.Add(std::move(done), absl::FailedPreconditionError(absl::StrCat(
                                      "reservation ", id, " already has a decode waiting on it")));
    return;
  }
  if (e.released) {
    deferred.Add(std::move(done),
                 absl::AbortedError(absl::StrCat("reservation ", id, " was released")));
    return;
  }
  if (e.committed) {
    KvCommit commit = std::move(e.commit);
    Held held = Erase(id, /*take=*/true, deferred);
    if (commit.outcome == KvOutcome::kComplete) {
      deferred.Add(std::move(done),
                   KvHandOff{std::move(commit), std::move(held.blocks), std::move(held.remote)});
    } else {
      deferred.Add(std::move(done), OutcomeFor(std::move(commit)));
    }
    return;
  }
  e.waiter = std::move(done);
}

int KvReservations::ExpireLeases() {
  Deferred deferred;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<uint64_t> ended;
  for (auto& [id, e] : entries_) {
    if (e.expires <= now) {
      ended.push_back(id);
    } else if (e.bytes_wait.has_value() && e.bytes_wait->deadline <= now) {
      deferred.AddBytes(std::move(e.bytes_wait->done),
                        absl::DeadlineExceededError(
                            absl::StrCat("only ", e.message_bytes, " of the ", e.bytes_wait->bytes,
                                         " KV bytes sent for reservation ", id, " arrived")));
      e.bytes_wait.reset();
    }
  }
  for (uint64_t id : ended) {
    Waiter waiter = std::move(entries_[id].waiter);
    const std::string request_id = entries_[id].request_id;
    Erase(id, /*take=*/false, deferred);
    TRIDENT_LOG(WARNING) << "KV reservation " << id << " (request " << request_id
                         << ") expired before its hand-off";
    deferred.Add(std::move(waiter),
                 absl::AbortedError(absl::StrCat("the lease of reservation ", id,
                                                 " ended before the KV was committed")));
  }
  return static_cast<int>(ended.size());
}

absl::Status KvReservations::WriteMessage(
    uint64_t id, absl::FunctionRef<absl::StatusOr<int64_t>(absl::Span<const int32_t>)> write) {
  std::vector<int32_t> blocks;
  TRIDENT_RETURN_IF_ERROR(BeginMessage(id, [&](absl::Span<const int32_t> held) {
    blocks.assign(held.begin(), held.end());
    return absl::OkStatus();
  }));
  // Without the lock: the reservation is pinned.
  absl::StatusOr<int64_t> wrote = write(blocks);
  EndMessage(id, wrote);
  return wrote.status();
}

absl::Status KvReservations::BeginMessage(
    uint64_t id, absl::FunctionRef<absl::Status(absl::Span<const int32_t>)> check) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.committed || it->second.released ||
      it->second.expires <= clock_->Now()) {
    return absl::NotFoundError(
        absl::StrCat("reservation ", id, " is unknown, committed, released or expired"));
  }
  if (it->second.remote.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("reservation ", id, "'s KV is at attention service ",
                     it->second.remote->service_id, ", not in this worker's blocks"));
  }
  // Only the writer's blocks: those from the prefix cache are shared.
  TRIDENT_RETURN_IF_ERROR(
      check(absl::MakeConstSpan(it->second.blocks).subspan(it->second.num_cached_blocks)));
  ++it->second.writers;
  return absl::OkStatus();
}

void KvReservations::EndMessage(uint64_t id, const absl::StatusOr<int64_t>& wrote) {
  Deferred deferred;
  absl::MutexLock lock(&mu_);
  if (auto it = entries_.find(id); it != entries_.end()) {
    Entry& e = it->second;
    --e.writers;
    if (wrote.ok()) e.message_bytes += *wrote;
    if (e.bytes_wait.has_value() && e.message_bytes >= e.bytes_wait->bytes) {
      deferred.AddBytes(std::move(e.bytes_wait->done), absl::OkStatus());
      e.bytes_wait.reset();
    }
  } else if (auto parked = parked_.find(id); parked != parked_.end()) {
    // The reservation ended meanwhile; the last write frees its blocks.
    if (--parked->second.second == 0) {
      if (absl::Status s = source_->Free(parked->second.first); !s.ok()) {
        TRIDENT_LOG(ERROR) << "freeing reservation " << id << "'s blocks: " << s;
      }
      parked_.erase(parked);
    }
  }
}

absl::Status KvReservations::AwaitBytes(uint64_t id, int64_t bytes, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  int64_t arrived = 0;
  bool writable = true;
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = entries_.find(id);
    writable = it != entries_.end() && !it->second.committed && !it->second.released;
    arrived = writable ? it->second.message_bytes : 0;
    return !writable || arrived >= bytes;
  };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  if (!writable) {
    return absl::NotFoundError(
        absl::StrCat("reservation ", id, " is unknown, committed, released or expired"));
  }
  if (arrived < bytes) {
    return absl::DeadlineExceededError(absl::StrCat(
        "only ", arrived, " of the ", bytes, " KV bytes sent for reservation ", id, " arrived"));
  }
  return absl::OkStatus();
}

void KvReservations::OnBytes(uint64_t id, int64_t bytes, absl::Time deadline,
                             std::function<void(absl::Status)> done) {
  Deferred deferred;
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.committed || it->second.released) {
    deferred.AddBytes(std::move(done),
                      absl::NotFoundError(absl::StrCat(
                          "reservation ", id, " is unknown, committed, released or expired")));
    return;
  }
  Entry& e = it->second;
  if (e.message_bytes >= bytes) {
    deferred.AddBytes(std::move(done), absl::OkStatus());
    return;
  }
  if (e.bytes_wait.has_value()) {
    deferred.AddBytes(std::move(done),
                      absl::FailedPreconditionError(absl::StrCat(
                          "reservation ", id, " already has a wait for its message bytes")));
    return;
  }
  e.bytes_wait = Entry::BytesWait{.bytes = bytes, .deadline = deadline, .done = std::move(done)};
}

bool KvReservations::IsPending(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  return it != entries_.end() && !it->second.released;
}

int32_t KvReservations::blocks_held() const {
  absl::MutexLock lock(&mu_);
  int32_t n = 0;
  for (const auto& [id, e] : entries_) n += static_cast<int32_t>(e.blocks.size());
  for (const auto& [id, parked] : parked_) n += static_cast<int32_t>(parked.first.size());
  return n;
}

int32_t KvReservations::num_reservations() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int32_t>(entries_.size());
}

}  // namespace trident::worker
