// Drives one KvIndex with a series of operations decoded from the input:
// Apply of a length-prefixed serialized trident.v1.KvEvents under one of
// three workers (or a worker's DRAM source) and three incarnations,
// RemoveWorker, SetDramHitValue, and prefix queries (Match,
// CachedPrefixTokens) of prefixes of a fixed prompt.
//
// A reference model of what kv_index.h documents runs alongside: every
// Apply must return what the model expects (only OK, DATA_LOSS or
// INVALID_ARGUMENT), the stats must equal the model's, and every query must
// find what the model's key sets hold.
//
// So that queries can hit, an event key (0, i) with i < 32 stands for the
// key of block i % 16 of the fixed prompt under the events' identity and
// block size, in the shared namespace (i < 16) or salt "t".

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "common/kv/block_hasher.h"
#include "common/kv/block_key.h"
#include "common/testing/fuzz_input.h"
#include "google/protobuf/stubs/logging.h"
#include "services/router/kv_index/kv_index.h"
#include "trident/v1/cluster.pb.h"

namespace {

using trident::kv::BlockKey;
using trident::router::kv_index::KvIndex;

// protobuf logs every string field of invalid UTF-8 it refuses, which the
// fuzzer makes many of.
[[maybe_unused]] const bool kProtobufQuiet = [] {
  google::protobuf::SetLogHandler(nullptr);
  return true;
}();

constexpr int kWorkers = 3;
constexpr size_t kPromptTokens = 96;
constexpr absl::string_view kSalts[] = {"", "t"};

const std::vector<int32_t>& Prompt() {
  static const std::vector<int32_t>* prompt = [] {
    auto* p = new std::vector<int32_t>(kPromptTokens);
    for (size_t i = 0; i < kPromptTokens; ++i) (*p)[i] = static_cast<int32_t>((i * 7 + 3) % 1000);
    return p;
  }();
  return *prompt;
}

std::string WorkerId(int w) { return "w" + std::to_string(w); }

// What kv_index.h documents, kept independently.
class Model {
 public:
  struct Source {
    uint64_t incarnation = 0;
    uint64_t last_seq = 0;
    bool synced = false;
    std::string identity;
    int32_t block_size = 0;
    absl::flat_hash_set<BlockKey> keys;
  };

  absl::StatusCode Apply(const std::string& id, uint64_t incarnation,
                         const trident::v1::KvEvents& e) {
    const int n = e.key_hi_size();
    if (e.key_lo_size() != n || e.stored_size() != n || e.block_size_tokens() < 1) {
      return absl::StatusCode::kInvalidArgument;
    }
    Source& s = sources_[id];
    if (s.incarnation != incarnation || s.identity != e.cache_identity() ||
        s.block_size != e.block_size_tokens()) {
      s = Source{.incarnation = incarnation,
                 .identity = e.cache_identity(),
                 .block_size = e.block_size_tokens()};
    }
    if (e.snapshot()) {
      s.keys.clear();
      s.synced = true;
      ++snapshots_;
    } else if (!s.synced) {
      return absl::StatusCode::kOk;  // Still waiting for a snapshot.
    } else if (e.first_seq() != s.last_seq + 1) {
      s.keys.clear();
      s.synced = false;
      ++gaps_;
      return absl::StatusCode::kDataLoss;
    }
    for (int i = 0; i < n; ++i) {
      const BlockKey key{e.key_hi(i), e.key_lo(i)};
      if (e.stored(i)) {
        s.keys.insert(key);
      } else {
        s.keys.erase(key);
      }
    }
    events_ += n;
    s.last_seq = e.last_seq();
    return absl::StatusCode::kOk;
  }

  void RemoveWorker(const std::string& worker) {
    sources_.erase(worker);
    sources_.erase(KvIndex::DramSource(worker));
    hit_values_.erase(worker);
  }

  // "Clamped to [0, 1]": a value that is no number is worth nothing.
  void SetDramHitValue(const std::string& worker, double value) {
    hit_values_[worker] = std::isnan(value) ? 0.0 : std::clamp(value, 0.0, 1.0);
  }

  absl::flat_hash_map<std::string, int64_t> Cached(absl::Span<const int32_t> prompt,
                                                   absl::string_view salt) const {
    absl::flat_hash_map<std::string, int64_t> cached;
    for (const auto& [id, s] : sources_) {
      if (!s.synced || s.keys.empty()) continue;
      const std::vector<BlockKey> keys =
          trident::kv::BlockHasher(s.block_size, s.identity).PrefixKeys(salt, prompt);
      size_t hit = 0;
      while (hit < keys.size() && s.keys.contains(keys[hit])) ++hit;
      if (hit > 0) cached[id] = static_cast<int64_t>(hit) * s.block_size;
    }
    return cached;
  }

  double HitValue(const std::string& worker) const {
    auto it = hit_values_.find(worker);
    return it == hit_values_.end() ? 0.0 : it->second;
  }

  const absl::flat_hash_map<std::string, Source>& sources() const { return sources_; }
  int64_t events() const { return events_; }
  int64_t snapshots() const { return snapshots_; }
  int64_t gaps() const { return gaps_; }

 private:
  absl::flat_hash_map<std::string, Source> sources_;
  absl::flat_hash_map<std::string, double> hit_values_;
  int64_t events_ = 0;
  int64_t snapshots_ = 0;
  int64_t gaps_ = 0;
};

// Replaces the stand-in keys (0, i < 32) by keys of the fixed prompt.
void SubstitutePromptKeys(trident::v1::KvEvents* e) {
  if (e->block_size_tokens() < 1 || e->block_size_tokens() > static_cast<int>(kPromptTokens)) {
    return;
  }
  const trident::kv::BlockHasher hasher(e->block_size_tokens(), e->cache_identity());
  std::vector<BlockKey> keys[2];
  for (int salt = 0; salt < 2; ++salt) keys[salt] = hasher.PrefixKeys(kSalts[salt], Prompt());
  const int n = std::min(e->key_hi_size(), e->key_lo_size());
  for (int i = 0; i < n; ++i) {
    if (e->key_hi(i) != 0 || e->key_lo(i) >= 32) continue;
    const std::vector<BlockKey>& salted = keys[e->key_lo(i) / 16];
    const size_t block = e->key_lo(i) % 16;
    if (block >= salted.size()) continue;
    e->set_key_hi(i, salted[block].hi);
    e->set_key_lo(i, salted[block].lo);
  }
}

void CheckStats(const KvIndex& index, const Model& model) {
  const trident::router::kv_index::KvIndexStats st = index.stats();
  int64_t keys = 0;
  for (const auto& [id, s] : model.sources()) keys += static_cast<int64_t>(s.keys.size());
  if (st.workers < 0 || st.workers > 2 * kWorkers ||
      st.workers != static_cast<int32_t>(model.sources().size()) || st.keys != keys ||
      st.events_total != model.events() || st.snapshots_total != model.snapshots() ||
      st.gaps_total != model.gaps()) {
    abort();
  }
}

void CheckQuery(const KvIndex& index, const Model& model, absl::Span<const int32_t> prompt,
                const std::string& salt) {
  const absl::flat_hash_map<std::string, int64_t> cached = index.CachedPrefixTokens(prompt, salt);
  if (cached != model.Cached(prompt, salt)) abort();
  for (const auto& [id, tokens] : cached) {
    if (tokens <= 0 || tokens > static_cast<int64_t>(prompt.size())) abort();
  }
  const KvIndex::PrefixMatch match = index.Match(prompt, salt);
  for (const auto& [id, tokens] : match.gpu) {
    if (absl::EndsWith(id, "/dram")) abort();
    auto it = cached.find(id);
    if (it == cached.end() || it->second != tokens) abort();
  }
  for (const auto& [id, tokens] : cached) {
    if (!absl::EndsWith(id, "/dram") && !match.gpu.contains(id)) abort();
  }
  for (const auto& [worker, equivalent] : match.dram) {
    auto dram = cached.find(KvIndex::DramSource(worker));
    if (dram == cached.end()) abort();
    auto gpu = cached.find(worker);
    const int64_t beyond = dram->second - (gpu == cached.end() ? 0 : gpu->second);
    const double expected = static_cast<double>(beyond) * model.HitValue(worker);
    if (equivalent <= 0 || equivalent > beyond || equivalent != static_cast<int64_t>(expected)) {
      abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  trident::testing::FuzzInput in(data, size);
  KvIndex index;
  Model model;
  while (in.remaining() > 0) {
    const uint8_t op = in.Take<uint8_t>();
    const std::string worker = WorkerId(op / 8 % kWorkers);
    switch (op % 8) {
      case 0:
      case 1:
      case 2: {  // Apply to the worker's cache (0, 1) or its DRAM source (2).
        const std::string source = op % 8 == 2 ? KvIndex::DramSource(worker) : worker;
        const uint64_t incarnation = 1 + in.Take<uint8_t>() % 3;
        const absl::string_view bytes = in.TakeBytes(in.Take<uint16_t>());
        trident::v1::KvEvents events;
        if (!events.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) break;
        SubstitutePromptKeys(&events);
        const absl::Status status = index.Apply(source, incarnation, events);
        if (status.code() != absl::StatusCode::kOk &&
            status.code() != absl::StatusCode::kDataLoss &&
            status.code() != absl::StatusCode::kInvalidArgument) {
          abort();
        }
        if (status.code() != model.Apply(source, incarnation, events)) abort();
        break;
      }
      case 3:
        index.RemoveWorker(worker);
        model.RemoveWorker(worker);
        break;
      case 4: {
        const uint64_t bits = in.Take<uint64_t>();
        double value;
        std::memcpy(&value, &bits, sizeof(value));
        index.SetDramHitValue(worker, value);
        model.SetDramHitValue(worker, value);
        break;
      }
      default: {  // A query: a prefix of the prompt, perhaps with one token changed.
        const size_t length = in.Take<uint8_t>() % (kPromptTokens + 1);
        std::vector<int32_t> prompt(Prompt().begin(), Prompt().begin() + length);
        const uint8_t change = in.Take<uint8_t>();
        if (change < length) prompt[change] += 1;
        CheckQuery(index, model, prompt, std::string(kSalts[op / 64 % 2]));
        break;
      }
    }
    CheckStats(index, model);
  }
  return 0;
}
