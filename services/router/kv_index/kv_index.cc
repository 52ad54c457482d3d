#include "services/router/kv_index/kv_index.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/kv/block_hasher.h"

namespace trident::router::kv_index {
namespace {

constexpr absl::string_view kDramSuffix = "/dram";

}  // namespace

absl::Status KvIndex::Apply(const std::string& worker_id, uint64_t incarnation,
                            const trident::v1::KvEvents& events) {
  const int n = events.key_hi_size();
  if (events.key_lo_size() != n || events.stored_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_events of worker ", worker_id, ": ", n, " key_hi, ", events.key_lo_size(),
        " key_lo and ", events.stored_size(), " stored entries"));
  }
  if (events.block_size_tokens() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("kv_events of worker ", worker_id,
                                                   ": block_size_tokens ",
                                                   events.block_size_tokens()));
  }
  absl::MutexLock lock(&mu_);
  Source& s = sources_[worker_id];
  if (s.incarnation != incarnation || s.cache_identity != events.cache_identity() ||
      s.block_size != events.block_size_tokens()) {
    // A restarted worker (or one serving something else) keeps nothing.
    s = Source();
    s.incarnation = incarnation;
    s.cache_identity = events.cache_identity();
    s.block_size = events.block_size_tokens();
  }
  if (events.snapshot()) {
    s.keys.clear();
    s.synced = true;
    ++snapshots_total_;
  } else if (!s.synced || events.first_seq() != s.last_seq + 1) {
    const bool was_synced = s.synced;
    s.keys.clear();
    s.synced = false;
    if (!was_synced) return absl::OkStatus();  // Still waiting for a snapshot.
    ++gaps_total_;
    return absl::DataLossError(absl::StrCat("kv_events of worker ", worker_id, ": events ",
                                            s.last_seq + 1, " to ", events.first_seq() - 1,
                                            " are missing; waiting for a snapshot"));
  }
  for (int i = 0; i < n; ++i) {
    const kv::BlockKey key{events.key_hi(i), events.key_lo(i)};
    if (events.stored(i)) {
      s.keys.insert(key);
    } else {
      s.keys.erase(key);
    }
  }
  events_total_ += n;
  s.last_seq = events.last_seq();
  return absl::OkStatus();
}

void KvIndex::RemoveWorker(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  sources_.erase(worker_id);
  sources_.erase(DramSource(worker_id));
  dram_hit_values_.erase(worker_id);
}

void KvIndex::SetDramHitValue(const std::string& worker_id, double value) {
  absl::MutexLock lock(&mu_);
  // std::clamp passes NaN through, and Match would convert NaN * tokens to
  // an integer (undefined): a value that is no number is worth nothing.
  dram_hit_values_[worker_id] = std::isnan(value) ? 0.0 : std::clamp(value, 0.0, 1.0);
}

KvIndex::PrefixMatch KvIndex::Match(absl::Span<const int32_t> prompt,
                                    const std::string& cache_salt) const {
  const absl::flat_hash_map<std::string, int64_t> all = CachedPrefixTokens(prompt, cache_salt);
  PrefixMatch match;
  for (const auto& [id, tokens] : all) {
    if (!absl::EndsWith(id, kDramSuffix)) match.gpu[id] = tokens;
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [id, tokens] : all) {
    if (!absl::EndsWith(id, kDramSuffix)) continue;
    const std::string worker(absl::string_view(id).substr(0, id.size() - kDramSuffix.size()));
    auto gpu = match.gpu.find(worker);
    const int64_t beyond = tokens - (gpu == match.gpu.end() ? 0 : gpu->second);
    auto value = dram_hit_values_.find(worker);
    const double worth = value == dram_hit_values_.end() ? 0.0 : value->second;
    const auto equivalent = static_cast<int64_t>(static_cast<double>(beyond) * worth);
    if (equivalent > 0) match.dram[worker] = equivalent;
  }
  return match;
}

absl::flat_hash_map<std::string, int64_t> KvIndex::CachedPrefixTokens(
    absl::Span<const int32_t> prompt, const std::string& cache_salt) const {
  // The prompt's keys per (identity, block size): one hashing per kind of
  // worker, whatever their number, done outside the lock that the workers'
  // load streams take for every sample.
  using Kind = std::pair<std::string, int32_t>;
  absl::flat_hash_map<Kind, std::vector<kv::BlockKey>> keys_by_kind;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, s] : sources_) {
      if (s.synced && !s.keys.empty()) keys_by_kind[{s.cache_identity, s.block_size}];
    }
  }
  for (auto& [kind, keys] : keys_by_kind) {
    keys = kv::BlockHasher(kind.second, kind.first).PrefixKeys(cache_salt, prompt);
  }
  absl::flat_hash_map<std::string, int64_t> cached;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, s] : sources_) {
    if (!s.synced) continue;
    auto kind = keys_by_kind.find(Kind{s.cache_identity, s.block_size});
    if (kind == keys_by_kind.end()) continue;  // Joined since: priced whole.
    const std::vector<kv::BlockKey>& keys = kind->second;
    size_t hit = 0;
    while (hit < keys.size() && s.keys.contains(keys[hit])) ++hit;
    if (hit > 0) cached[id] = static_cast<int64_t>(hit) * s.block_size;
  }
  return cached;
}

KvIndexStats KvIndex::stats() const {
  absl::MutexLock lock(&mu_);
  KvIndexStats st;
  st.workers = static_cast<int32_t>(sources_.size());
  for (const auto& [id, s] : sources_) st.keys += static_cast<int64_t>(s.keys.size());
  st.events_total = events_total_;
  st.snapshots_total = snapshots_total_;
  st.gaps_total = gaps_total_;
  return st;
}

}  // namespace trident::router::kv_index
