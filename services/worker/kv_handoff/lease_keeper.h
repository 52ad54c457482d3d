#ifndef TRIDENT_SERVICES_WORKER_KV_HANDOFF_LEASE_KEEPER_H_
#define TRIDENT_SERVICES_WORKER_KV_HANDOFF_LEASE_KEEPER_H_

// The prefill side's hold on KV reservations: a decode worker frees a
// reservation whose lease ends before its CommitKv, so a prompt that waits in
// a long prefill queue, or computes and transfers for longer than the lease
// (the router's --kv_lease_ms, 30 s by default), would lose its reservation
// and fail after all its compute. The keeper renews (Decode.RenewKv) every
// lease it keeps once less than half of it is left, asking for the lease's
// original length, until the prefill worker hands the reservation over
// (CommitKv) or gives it up. A lease still ends when the prefill worker
// dies: nobody renews it then.
//
// A renewal that finds the reservation gone (NOT_FOUND: its lease ended, or
// FAILED_PRECONDITION: the decode worker restarted) calls the lease's `lost`
// callback once, so that the prompt stops at once rather than after its
// compute. Other failures (the decode worker unreachable for a moment) are
// retried at the next RenewDue; the lease's end stays where it was, and the
// prefill worker writes nothing after it (LeaseEnd).
//
// Thread-safe. RenewDue makes its RPCs without the lock, one at a time;
// PrefillService calls it from one thread.

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/time/clock.h"
#include "trident/v1/worker.pb.h"

namespace trident::worker {

class LeaseKeeper {
 public:
  // Renews `destination`'s reservation for `lease` from now; returns the
  // lease granted (RenewKvResponse.lease_remaining).
  using RenewFn = std::function<absl::StatusOr<absl::Duration>(
      const trident::v1::KvDestination& destination, absl::Duration lease)>;

  // `clock` is not owned and must outlive the keeper.
  LeaseKeeper(const Clock* clock, RenewFn renew);

  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // Keeps `destination`'s lease, granted now for destination.lease_remaining;
  // `lost` runs at most once, outside the keeper's lock, if the reservation
  // turns out gone. Returns the key for LeaseEnd and Remove (never 0).
  uint64_t Add(const trident::v1::KvDestination& destination,
               std::function<void(const absl::Status&)> lost) ABSL_LOCKS_EXCLUDED(mu_);

  // Stops keeping the lease (before CommitKv, or when the call ends). No-op
  // for an unknown key. A renewal in flight for it is let finish; its result
  // is dropped.
  void Remove(uint64_t key) ABSL_LOCKS_EXCLUDED(mu_);

  // When the lease ends as far as this worker knows, on its clock (counting
  // a renewal's lease from when the renewal was sent);
  // absl::InfinitePast() for an unknown key.
  absl::Time LeaseEnd(uint64_t key) const ABSL_LOCKS_EXCLUDED(mu_);

  // Renews every kept lease with less than half of its length left. Returns
  // how many renewals succeeded.
  int RenewDue() ABSL_LOCKS_EXCLUDED(mu_);

  // Leases kept.
  int size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Lease {
    trident::v1::KvDestination destination;
    absl::Duration length;
    absl::Time end;
    std::function<void(const absl::Status&)> lost;
  };

  const Clock* const clock_;
  const RenewFn renew_;
  mutable absl::Mutex mu_;
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Lease>> leases_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_KV_HANDOFF_LEASE_KEEPER_H_
