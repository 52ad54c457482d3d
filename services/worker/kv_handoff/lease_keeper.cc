#include "services/worker/kv_handoff/lease_keeper.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/time/proto_time.h"

namespace trident::worker {

LeaseKeeper::LeaseKeeper(const Clock* clock, RenewFn renew)
    : clock_(clock), renew_(std::move(renew)) {}

uint64_t LeaseKeeper::Add(const trident::v1::KvDestination& destination,
                          std::function<void(const absl::Status&)> lost) {
  auto lease = std::make_shared<Lease>();
  lease->destination = destination;
  lease->length = DurationFromProto(destination.lease_remaining());
  lease->end = clock_->Now() + lease->length;
  lease->lost = std::move(lost);
  absl::MutexLock lock(&mu_);
  const uint64_t key = next_key_++;
  leases_.emplace(key, std::move(lease));
  return key;
}

void LeaseKeeper::Remove(uint64_t key) {
  absl::MutexLock lock(&mu_);
  leases_.erase(key);
}

absl::Time LeaseKeeper::LeaseEnd(uint64_t key) const {
  absl::MutexLock lock(&mu_);
  auto it = leases_.find(key);
  return it == leases_.end() ? absl::InfinitePast() : it->second->end;
}

int LeaseKeeper::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(leases_.size());
}

int LeaseKeeper::RenewDue() {
  std::vector<std::pair<uint64_t, std::shared_ptr<Lease>>> due;
  {
    const absl::Time now = clock_->Now();
    absl::MutexLock lock(&mu_);
    for (const auto& [key, lease] : leases_) {
      if (lease->end - now < lease->length / 2) due.emplace_back(key, lease);
    }
  }
  int renewed = 0;
  for (const auto& [key, lease] : due) {
    const absl::Time sent = clock_->Now();
    absl::StatusOr<absl::Duration> granted = renew_(lease->destination, lease->length);
    std::function<void(const absl::Status&)> lost;
    absl::Status why;
    {
      absl::MutexLock lock(&mu_);
      auto it = leases_.find(key);
      if (it == leases_.end()) continue;  // Removed meanwhile: handed over or ended.
      if (granted.ok()) {
        lease->end = sent + *granted;
        ++renewed;
        continue;
      }
      const absl::StatusCode code = granted.status().code();
      if (code != absl::StatusCode::kNotFound && code != absl::StatusCode::kFailedPrecondition) {
        TRIDENT_LOG(WARNING) << "renewing the KV reservation "
                             << lease->destination.reservation_id() << " on decode worker "
                             << lease->destination.decode_worker_id()
                             << " failed (retried): " << granted.status();
        continue;
      }
      why = absl::AbortedError(absl::StrCat(
          "the KV reservation on decode worker ", lease->destination.decode_worker_id(), " at ",
          lease->destination.decode_address(), " is gone: ", granted.status().message()));
      lost = std::move(lease->lost);
      leases_.erase(it);
    }
    if (lost) lost(why);
  }
  return renewed;
}

}  // namespace trident::worker
