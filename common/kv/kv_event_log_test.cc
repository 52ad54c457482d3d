#include "common/kv/kv_event_log.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::kv {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

BlockKey K(uint64_t n) { return BlockKey{n, n}; }
KvEvent S(uint64_t n) { return KvEvent{true, K(n)}; }
KvEvent R(uint64_t n) { return KvEvent{false, K(n)}; }

TEST(KvEventLogTest, FirstReadIsASnapshotThenDeltasInOrder) {
  KvEventLog log;
  log.Stored(K(1));
  log.Stored(K(2));
  uint64_t cursor = 0;
  KvEventBatch first = log.ReadSince(&cursor);
  EXPECT_TRUE(first.snapshot);
  EXPECT_THAT(first.events, UnorderedElementsAre(S(1), S(2)));
  EXPECT_EQ(first.last_seq, 2u);
  EXPECT_EQ(cursor, 2u);

  log.Removed(K(1));
  log.Stored(K(1));
  log.Removed(K(1));
  KvEventBatch delta = log.ReadSince(&cursor);
  EXPECT_FALSE(delta.snapshot);
  EXPECT_EQ(delta.first_seq, 3u);
  EXPECT_EQ(delta.last_seq, 5u);
  EXPECT_THAT(delta.events, ElementsAre(R(1), S(1), R(1)));
  // Nothing new: an empty delta that still follows on.
  KvEventBatch empty = log.ReadSince(&cursor);
  EXPECT_FALSE(empty.snapshot);
  EXPECT_EQ(empty.first_seq, 6u);
  EXPECT_EQ(empty.last_seq, 5u);
  EXPECT_TRUE(empty.events.empty());
  EXPECT_EQ(log.num_keys(), 1u);
}

TEST(KvEventLogTest, AReaderTheRingLeftBehindGetsASnapshot) {
  KvEventLog log(/*capacity=*/2);
  uint64_t cursor = 0;
  log.ReadSince(&cursor);
  for (uint64_t k = 1; k <= 5; ++k) log.Stored(K(k));
  log.Removed(K(3));
  KvEventBatch batch = log.ReadSince(&cursor);
  EXPECT_TRUE(batch.snapshot);
  EXPECT_THAT(batch.events, UnorderedElementsAre(S(1), S(2), S(4), S(5)));
  EXPECT_EQ(cursor, 6u);
  // A cursor from elsewhere (past this log's end: a restarted worker) too.
  uint64_t foreign = 100;
  EXPECT_TRUE(log.ReadSince(&foreign).snapshot);
}

}  // namespace
}  // namespace trident::kv
