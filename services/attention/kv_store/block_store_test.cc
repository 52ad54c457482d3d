#include "services/attention/kv_store/block_store.h"

#include <cstdint>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/attention/kv_store/heap_kv_pool.h"

namespace trident::attention {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::IsOk;
using testing::StatusIs;

BlockFormat Format(const std::string& model = "model-a") {
  return BlockFormat{.model_identity = model,
                     .num_layers = 2,
                     .num_kv_heads = 2,
                     .head_dim = 16,
                     .block_size = 4,
                     .dtype = numeric::DType::kBF16};
}

// 2 layers x (K + V) x 2 heads x 4 tokens x 16 dims x 2 bytes.
constexpr uint64_t kBlockBytes = 2 * 2 * 2 * 4 * 16 * 2;

std::vector<kv::BlockKey> Keys(uint64_t first, int n) {
  std::vector<kv::BlockKey> keys;
  for (int i = 0; i < n; ++i) keys.push_back(kv::BlockKey{.hi = first + i, .lo = 1});
  return keys;
}

// Bytes of block `i`: every byte i + 1.
std::string Bytes(int i, int count = 1) {
  std::string bytes;
  for (int b = 0; b < count; ++b) bytes.append(kBlockBytes, static_cast<char>(i + b + 1));
  return bytes;
}

class BlockStoreTest : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_THAT(store_.CheckInvariants(), IsOk()); }

  // Reserves and writes `keys`; returns the indices written.
  std::vector<int32_t> Put(const std::vector<kv::BlockKey>& keys) {
    absl::StatusOr<BlockStore::Reservation> r = store_.Reserve(owner_, Format(), keys);
    EXPECT_THAT(r, IsOk());
    if (!r.ok() || r->ticket == 0) return {};
    for (size_t i = 0; i < r->write.size(); ++i) {
      const std::string data = Bytes(r->write[i]);
      EXPECT_THAT(store_.Write(7, r->ticket, static_cast<int32_t>(i), 1, data.data(), data.size()),
                  IsOk());
    }
    EXPECT_TRUE(store_.Release(owner_, r->ticket));
    return r->write;
  }

  FakeClock clock_;
  HeapKvPool pool_{64 * kBlockBytes};
  BlockStore store_{&pool_, &clock_,
                    BlockStoreOptions{.capacity_bytes = 4 * kBlockBytes,
                                      .put_lease = absl::Seconds(5),
                                      .read_lease = absl::Seconds(5)}};
  BlockOwner owner_{.owner_id = "w0", .incarnation = 7};
};

TEST_F(BlockStoreTest, AWrittenChainIsFoundAndReadBack) {
  EXPECT_THAT(Put(Keys(10, 3)), ElementsAre(0, 1, 2));
  absl::StatusOr<BlockStore::Reservation> again = store_.Reserve(owner_, Format(), Keys(10, 3));
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->ticket, 0u);  // Held already: nothing to write, nothing refused.
  EXPECT_EQ(again->refused_from, 3);
  absl::StatusOr<BlockStore::Match> match = store_.Lookup(owner_, Format(), Keys(10, 3));
  ASSERT_THAT(match, IsOk());
  EXPECT_EQ(match->matched, 3);
  EXPECT_EQ(match->block_bytes, kBlockBytes);
  std::string out(3 * kBlockBytes, '\0');
  ASSERT_THAT(store_.Read(7, match->ticket, 0, 3, out.data(), out.size()), IsOk());
  EXPECT_EQ(out, Bytes(0, 3));
  EXPECT_EQ(store_.Stats().pinned_blocks, 3);
  EXPECT_TRUE(store_.Release(owner_, match->ticket));
  EXPECT_FALSE(store_.Release(owner_, match->ticket));
  EXPECT_EQ(store_.Stats().pinned_blocks, 0);
  EXPECT_EQ(store_.Stats().blocks_read_total, 3);
}

TEST_F(BlockStoreTest, ALookupStopsAtTheFirstMissingKey) {
  Put(Keys(10, 2));
  std::vector<kv::BlockKey> keys = Keys(10, 3);
  absl::StatusOr<BlockStore::Match> match = store_.Lookup(owner_, Format(), keys);
  ASSERT_THAT(match, IsOk());
  EXPECT_EQ(match->matched, 2);
  store_.Release(owner_, match->ticket);
  keys.front() = kv::BlockKey{.hi = 99, .lo = 1};
  match = store_.Lookup(owner_, Format(), keys);
  ASSERT_THAT(match, IsOk());
  EXPECT_EQ(match->matched, 0);
  EXPECT_EQ(match->ticket, 0u);
}

TEST_F(BlockStoreTest, AReservedBlockIsNotReadableUntilWritten) {
  absl::StatusOr<BlockStore::Reservation> r = store_.Reserve(owner_, Format(), Keys(10, 2));
  ASSERT_THAT(r, IsOk());
  ASSERT_THAT(r->write, ElementsAre(0, 1));
  absl::StatusOr<BlockStore::Match> match = store_.Lookup(owner_, Format(), Keys(10, 2));
  ASSERT_THAT(match, IsOk());
  EXPECT_EQ(match->matched, 0);
  // A second writer skips keys being written.
  absl::StatusOr<BlockStore::Reservation> again = store_.Reserve(owner_, Format(), Keys(10, 2));
  ASSERT_THAT(again, IsOk());
  EXPECT_EQ(again->ticket, 0u);
  const std::string data = Bytes(0);
  ASSERT_THAT(store_.Write(7, r->ticket, 0, 1, data.data(), data.size()), IsOk());
  EXPECT_THAT(store_.Write(7, r->ticket, 0, 1, data.data(), data.size()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("written already")));
  match = store_.Lookup(owner_, Format(), Keys(10, 2));
  ASSERT_THAT(match, IsOk());
  EXPECT_EQ(match->matched, 1);
  store_.Release(owner_, match->ticket);
  // Releasing the put frees the block it never wrote.
  EXPECT_TRUE(store_.Release(owner_, r->ticket));
  EXPECT_EQ(store_.Stats().reserved_blocks, 0);
  EXPECT_EQ(store_.Stats().blocks, 1);
}

TEST_F(BlockStoreTest, AnExpiredPutFreesItsUnwrittenBlocks) {
  absl::StatusOr<BlockStore::Reservation> r = store_.Reserve(owner_, Format(), Keys(10, 2));
  ASSERT_THAT(r, IsOk());
  clock_.Advance(absl::Seconds(4));
  EXPECT_EQ(store_.Sweep(), 0);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(store_.Sweep(), 1);
  EXPECT_EQ(store_.Stats().reserved_blocks, 0);
  EXPECT_EQ(store_.Stats().bytes, 0);
  const std::string data = Bytes(0);
  EXPECT_THAT(store_.Write(7, r->ticket, 0, 1, data.data(), data.size()),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(BlockStoreTest, TheLeastRecentlyUsedUnpinnedBlockMakesRoom) {
  Put(Keys(10, 4));  // The budget: 4 blocks.
  // A lookup of blocks 10 and 11 makes them the most recently used; a pin
  // on 12 keeps it.
  absl::StatusOr<BlockStore::Match> used = store_.Lookup(owner_, Format(), Keys(10, 2));
  ASSERT_THAT(used, IsOk());
  store_.Release(owner_, used->ticket);
  absl::StatusOr<BlockStore::Match> pinned = store_.Lookup(owner_, Format(), Keys(12, 1));
  ASSERT_THAT(pinned, IsOk());
  EXPECT_THAT(Put(Keys(20, 2)), ElementsAre(0, 1));  // Evicts 13, then 10.
  EXPECT_EQ(store_.Stats().evictions_total, 2);
  EXPECT_EQ(store_.Lookup(owner_, Format(), Keys(13, 1))->matched, 0);
  EXPECT_EQ(store_.Lookup(owner_, Format(), Keys(10, 1))->matched, 0);
  absl::StatusOr<BlockStore::Match> kept = store_.Lookup(owner_, Format(), Keys(11, 2));
  ASSERT_THAT(kept, IsOk());
  EXPECT_EQ(kept->matched, 2);
  store_.Release(owner_, kept->ticket);
  store_.Release(owner_, pinned->ticket);
}

TEST_F(BlockStoreTest, APutStopsWhereNothingMoreCanGo) {
  absl::StatusOr<BlockStore::Match> pins[2];
  Put(Keys(10, 4));
  pins[0] = store_.Lookup(owner_, Format(), Keys(10, 4));  // Every block pinned.
  absl::StatusOr<BlockStore::Reservation> r = store_.Reserve(owner_, Format(), Keys(20, 3));
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->ticket, 0u);
  EXPECT_EQ(r->refused_from, 0);
  EXPECT_EQ(store_.Stats().blocks_refused_total, 3);
  store_.Release(owner_, pins[0]->ticket);
}

TEST_F(BlockStoreTest, AnotherModelsBlocksAreRefused) {
  Put(Keys(10, 1));
  EXPECT_THAT(store_.Reserve(owner_, Format("model-b"), Keys(10, 1)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("model-a")));
  EXPECT_THAT(store_.Lookup(owner_, Format("model-b"), Keys(10, 1)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  BlockFormat bad = Format();
  bad.head_dim = 0;
  EXPECT_THAT(store_.Lookup(owner_, bad, Keys(10, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head_dim")));
}

TEST_F(BlockStoreTest, TicketsAreTheirOwnersAlone) {
  absl::StatusOr<BlockStore::Reservation> r = store_.Reserve(owner_, Format(), Keys(10, 1));
  ASSERT_THAT(r, IsOk());
  const std::string data = Bytes(0);
  EXPECT_THAT(store_.Write(8, r->ticket, 0, 1, data.data(), data.size()),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_.Write(7, r->ticket, 0, 2, data.data(), data.size()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(store_.Write(7, r->ticket, 0, 1, data.data(), data.size() - 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::string out(kBlockBytes, '\0');
  EXPECT_THAT(store_.Read(7, r->ticket, 0, 1, out.data(), out.size()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("put's")));
  EXPECT_FALSE(store_.Release(BlockOwner{.owner_id = "w1", .incarnation = 7}, r->ticket));
  EXPECT_EQ(store_.ReleaseOwner("w0"), 1);
  EXPECT_EQ(store_.Stats().bytes, 0);
}

TEST(BlockStoreOffTest, AZeroBudgetStoresNothing) {
  FakeClock clock;
  HeapKvPool pool(64 * kBlockBytes);
  BlockStore store(&pool, &clock, BlockStoreOptions{.capacity_bytes = 0});
  absl::StatusOr<BlockStore::Reservation> r =
      store.Reserve(BlockOwner{.owner_id = "w0", .incarnation = 1}, Format(), Keys(1, 2));
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->ticket, 0u);
  EXPECT_THAT(store.CheckInvariants(), IsOk());
}

// A borrow pins its chain for reading in place: no lease runs out, no
// eviction takes it, the data plane cannot read it, and Return ends it.
TEST_F(BlockStoreTest, ABorrowedChainStaysUntilReturned) {
  Put(Keys(10, 3));
  absl::StatusOr<BlockStore::Borrowed> borrowed = store_.Borrow(Format(), Keys(10, 4));
  ASSERT_THAT(borrowed, IsOk());
  ASSERT_EQ(borrowed->blocks.size(), 3u);
  EXPECT_EQ(std::string(borrowed->blocks[1], kBlockBytes), Bytes(1));
  EXPECT_EQ(store_.Stats().borrows, 1);
  EXPECT_EQ(store_.Stats().borrowed_blocks, 3);
  clock_.Advance(absl::Minutes(5));
  EXPECT_EQ(store_.Sweep(), 0);
  EXPECT_EQ(store_.ReleaseOwner("w0"), 0);
  EXPECT_FALSE(store_.Release(owner_, borrowed->ticket));
  std::string out(kBlockBytes, '\0');
  EXPECT_THAT(store_.Read(7, borrowed->ticket, 0, 1, out.data(), out.size()),
              StatusIs(absl::StatusCode::kNotFound));
  // A put that needs room finds only one unpinned block's worth.
  absl::StatusOr<BlockStore::Reservation> r = store_.Reserve(owner_, Format(), Keys(20, 3));
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->refused_from, 1);
  EXPECT_TRUE(store_.Release(owner_, r->ticket));
  EXPECT_EQ(std::string(borrowed->blocks[2], kBlockBytes), Bytes(2));
  EXPECT_TRUE(store_.Return(borrowed->ticket));
  EXPECT_FALSE(store_.Return(borrowed->ticket));
  EXPECT_EQ(store_.Stats().borrowed_blocks, 0);
  EXPECT_EQ(store_.Stats().pinned_blocks, 0);
  absl::StatusOr<BlockStore::Borrowed> none = store_.Borrow(Format(), Keys(90, 2));
  ASSERT_THAT(none, IsOk());
  EXPECT_EQ(none->ticket, 0u);
  EXPECT_THAT(store_.Borrow(Format("model-b"), Keys(10, 1)),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

// Parts of a Read's copies, done by as many callers as parts, do every
// byte once, whatever the split falls on.
TEST(CopyPartTest, PartsTogetherCopyEveryByte) {
  std::vector<std::string> from = {std::string(1000, 'a'), std::string(7, 'b'),
                                    std::string(4096, 'c')};
  for (size_t i = 0; i < from[2].size(); ++i) from[2][i] = static_cast<char>('A' + i % 26);
  for (size_t parts : {1, 2, 3, 7, 5103, 6000}) {
    std::vector<std::string> to = {std::string(1000, '.'), std::string(7, '.'),
                                   std::string(4096, '.')};
    std::vector<BlockStore::BlockCopy> copies;
    for (size_t i = 0; i < from.size(); ++i) {
      copies.push_back({.from = from[i].data(), .to = to[i].data(), .bytes = from[i].size()});
    }
    for (size_t part = 0; part < parts; ++part) CopyPart(copies, parts, part);
    EXPECT_EQ(to, from) << parts << " parts";
  }
}

// Blocks become events when readable and when freed after that: a reader
// from cursor 0 gets a snapshot, then deltas in order; reserved blocks and
// a put's unwritten ones never show.
TEST_F(BlockStoreTest, ReadableBlocksAndTheirEvictionAreEvents) {
  uint64_t cursor = 0;
  Put(Keys(10, 3));
  kv::KvEventBatch batch = store_.EventsSince(&cursor);
  EXPECT_TRUE(batch.snapshot);
  EXPECT_EQ(batch.events.size(), 3u);
  absl::StatusOr<BlockStore::Reservation> unwritten = store_.Reserve(owner_, Format(), Keys(50, 1));
  ASSERT_THAT(unwritten, IsOk());
  EXPECT_TRUE(store_.Release(owner_, unwritten->ticket));
  EXPECT_TRUE(store_.EventsSince(&cursor).events.empty());
  // 5 blocks into a 4-block store: the reservation evicts the oldest, then
  // the writes make the new ones readable.
  Put(Keys(20, 2));
  batch = store_.EventsSince(&cursor);
  EXPECT_FALSE(batch.snapshot);
  ASSERT_EQ(batch.events.size(), 3u);
  EXPECT_EQ(batch.events[0], (kv::KvEvent{.stored = false, .key = Keys(10, 1)[0]}));
  EXPECT_EQ(batch.events[1], (kv::KvEvent{.stored = true, .key = Keys(20, 1)[0]}));
  EXPECT_EQ(batch.events[2], (kv::KvEvent{.stored = true, .key = Keys(21, 1)[0]}));
}

}  // namespace
}  // namespace trident::attention
