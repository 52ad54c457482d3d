#include "common/kv/kv_event_log.h"

#include <algorithm>

namespace trident::kv {

KvEventLog::KvEventLog(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

void KvEventLog::Append(bool stored, const BlockKey& key) {
  ring_.push_back(Event{++seq_, KvEvent{stored, key}});
  if (ring_.size() > capacity_) ring_.pop_front();
}

void KvEventLog::Stored(const BlockKey& key) {
  absl::MutexLock lock(&mu_);
  keys_.insert(key);
  Append(true, key);
}

void KvEventLog::Removed(const BlockKey& key) {
  absl::MutexLock lock(&mu_);
  keys_.erase(key);
  Append(false, key);
}

KvEventBatch KvEventLog::ReadSince(uint64_t* cursor) const {
  absl::MutexLock lock(&mu_);
  KvEventBatch batch;
  batch.last_seq = seq_;
  const uint64_t oldest = ring_.empty() ? seq_ + 1 : ring_.front().seq;
  // A reader past the end (another log's cursor) is reset too.
  if (*cursor == 0 || *cursor + 1 < oldest || *cursor > seq_) {
    batch.snapshot = true;
    batch.first_seq = 1;
    batch.events.reserve(keys_.size());
    for (const BlockKey& key : keys_) batch.events.push_back(KvEvent{true, key});
  } else {
    batch.first_seq = *cursor + 1;
    // The ring is ordered by seq: skip to the first unseen event.
    auto it = ring_.begin() + static_cast<std::ptrdiff_t>(*cursor + 1 - oldest);
    for (; it != ring_.end(); ++it) batch.events.push_back(it->event);
  }
  *cursor = seq_;
  return batch;
}

size_t KvEventLog::num_keys() const {
  absl::MutexLock lock(&mu_);
  return keys_.size();
}

uint64_t KvEventLog::last_seq() const {
  absl::MutexLock lock(&mu_);
  return seq_;
}

}  // namespace trident::kv
