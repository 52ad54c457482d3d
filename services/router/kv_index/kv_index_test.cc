#include "services/router/kv_index/kv_index.h"

#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "common/kv/block_hasher.h"
#include "common/kv/kv_event_log.h"
#include "common/kv/kv_events_proto.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::router::kv_index {
namespace {

using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr int32_t kBlock = 4;
const char kModel[] = "model|kv=f32";

std::vector<int32_t> Tokens(int32_t from, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

// A worker's cache as its events see it: the real log, keys from the real
// hasher, batches through the real proto conversion.
struct Worker {
  explicit Worker(std::string id_in, uint64_t incarnation_in = 1)
      : id(std::move(id_in)), incarnation(incarnation_in), hasher(kBlock, kModel) {}
  // Caches the whole blocks of `tokens`.
  void Cache(const std::vector<int32_t>& tokens, const std::string& salt = "") {
    for (const kv::BlockKey& k : hasher.PrefixKeys(salt, tokens)) log.Stored(k);
  }
  // Evicts the last whole block of `tokens`.
  void Evict(const std::vector<int32_t>& tokens) { log.Removed(hasher.PrefixKeys("", tokens).back()); }
  // The next sample's batch.
  trident::v1::KvEvents Next() {
    trident::v1::KvEvents out;
    kv::KvEventsToProto(log.ReadSince(&cursor), kModel, kBlock, "gpu", &out);
    return out;
  }
  absl::Status SendTo(KvIndex& index) { return index.Apply(id, incarnation, Next()); }

  std::string id;
  uint64_t incarnation;
  kv::BlockHasher hasher;
  kv::KvEventLog log;
  uint64_t cursor = 0;
};

TEST(KvIndexTest, FindsEachWorkersLongestCachedPrefix) {
  KvIndex index;
  Worker a("a"), b("b");
  a.Cache(Tokens(0, 12));  // 3 blocks.
  b.Cache(Tokens(0, 4));   // 1 block.
  ASSERT_THAT(a.SendTo(index), IsOk());
  ASSERT_THAT(b.SendTo(index), IsOk());
  // A prompt of 10 tokens sharing 9: whole blocks only.
  std::vector<int32_t> prompt = Tokens(0, 9);
  prompt.push_back(99);
  EXPECT_THAT(index.CachedPrefixTokens(prompt, ""),
              UnorderedElementsAre(Pair("a", 8), Pair("b", 4)));
  // Another salt: nothing.
  EXPECT_THAT(index.CachedPrefixTokens(prompt, "tenant"), IsEmpty());
  // A prompt differing in its first block: nothing either.
  EXPECT_THAT(index.CachedPrefixTokens(Tokens(1, 12), ""), IsEmpty());

  // Deltas: b learns a block, a evicts its tail.
  b.Cache(Tokens(0, 8));
  a.Evict(Tokens(0, 12));
  ASSERT_THAT(a.SendTo(index), IsOk());
  ASSERT_THAT(b.SendTo(index), IsOk());
  EXPECT_THAT(index.CachedPrefixTokens(Tokens(0, 13), ""),
              UnorderedElementsAre(Pair("a", 8), Pair("b", 8)));
  EXPECT_EQ(index.stats().snapshots_total, 2);
}

TEST(KvIndexTest, ARestartedWorkerReplacesWhatItHeld) {
  KvIndex index;
  Worker before("w", /*incarnation=*/1);
  before.Cache(Tokens(0, 16));
  ASSERT_THAT(before.SendTo(index), IsOk());
  // The new process holds another prefix; its stream starts with a snapshot.
  Worker after("w", /*incarnation=*/2);
  after.Cache(Tokens(100, 8));
  ASSERT_THAT(after.SendTo(index), IsOk());
  EXPECT_THAT(index.CachedPrefixTokens(Tokens(0, 16), ""), IsEmpty());
  EXPECT_THAT(index.CachedPrefixTokens(Tokens(100, 9), ""), UnorderedElementsAre(Pair("w", 8)));
  index.RemoveWorker("w");
  EXPECT_THAT(index.CachedPrefixTokens(Tokens(100, 9), ""), IsEmpty());
  EXPECT_EQ(index.stats().workers, 0);
}

TEST(KvIndexTest, AGapForgetsTheWorkerUntilItsNextSnapshot) {
  KvIndex index;
  Worker w("w");
  w.Cache(Tokens(0, 8));
  ASSERT_THAT(w.SendTo(index), IsOk());
  w.Cache(Tokens(0, 12));
  (void)w.Next();  // A sample the router never saw.
  w.Cache(Tokens(0, 16));
  EXPECT_THAT(w.SendTo(index), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(index.CachedPrefixTokens(Tokens(0, 16), ""), IsEmpty());
  // Deltas do not count until the snapshot.
  w.Cache(Tokens(0, 20));
  EXPECT_THAT(w.SendTo(index), IsOk());
  EXPECT_THAT(index.CachedPrefixTokens(Tokens(0, 20), ""), IsEmpty());
  // The periodic snapshot (a fresh cursor) brings it back whole.
  w.cursor = 0;
  ASSERT_THAT(w.SendTo(index), IsOk());
  EXPECT_THAT(index.CachedPrefixTokens(Tokens(0, 21), ""), UnorderedElementsAre(Pair("w", 20)));
  EXPECT_EQ(index.stats().gaps_total, 1);
}

TEST(KvIndexTest, MalformedBatchesAreRefused) {
  KvIndex index;
  trident::v1::KvEvents bad;
  bad.set_block_size_tokens(kBlock);
  bad.add_key_hi(1);
  EXPECT_THAT(index.Apply("w", 1, bad), StatusIs(absl::StatusCode::kInvalidArgument));
  trident::v1::KvEvents no_block;
  EXPECT_THAT(index.Apply("w", 1, no_block), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(index.stats().workers, 0);
}

// A worker's DRAM tier (its store's events, relayed under DramSource)
// counts what it holds beyond the worker's own cache, times the worker's
// hit value; removing the worker forgets both.
TEST(KvIndexTest, ADramTierCountsWhatItHoldsBeyondTheCacheAtItsWorth) {
  KvIndex index;
  Worker a("a"), a_store(KvIndex::DramSource("a")), b_store(KvIndex::DramSource("b"));
  a.Cache(Tokens(0, 8));         // 2 blocks on a's GPU.
  a_store.Cache(Tokens(0, 24));  // 6 blocks in a's store.
  b_store.Cache(Tokens(0, 16));  // 4 blocks in b's store; b fetching loses.
  ASSERT_THAT(a.SendTo(index), IsOk());
  ASSERT_THAT(a_store.SendTo(index), IsOk());
  ASSERT_THAT(b_store.SendTo(index), IsOk());
  index.SetDramHitValue("a", 0.5);
  index.SetDramHitValue("b", 0.0);
  const KvIndex::PrefixMatch match = index.Match(Tokens(0, 30), "");
  EXPECT_THAT(match.gpu, UnorderedElementsAre(Pair("a", 8)));
  // a: (24 - 8) tokens at half their worth; b: nothing.
  EXPECT_THAT(match.dram, UnorderedElementsAre(Pair("a", 8)));
  index.SetDramHitValue("b", 2.0);  // Clamped to 1.
  EXPECT_THAT(index.Match(Tokens(0, 30), "").dram,
              UnorderedElementsAre(Pair("a", 8), Pair("b", 16)));
  index.SetDramHitValue("b", std::numeric_limits<double>::quiet_NaN());  // Worth nothing.
  EXPECT_THAT(index.Match(Tokens(0, 30), "").dram, UnorderedElementsAre(Pair("a", 8)));
  index.SetDramHitValue("b", 2.0);
  index.RemoveWorker("a");
  EXPECT_THAT(index.Match(Tokens(0, 30), "").dram, UnorderedElementsAre(Pair("b", 16)));
  EXPECT_THAT(index.Match(Tokens(0, 30), "").gpu, IsEmpty());
}

}  // namespace
}  // namespace trident::router::kv_index
