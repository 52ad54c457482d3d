#include "common/transport/attention/message_buffers.h"

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace trident::transport::attention {
namespace {

TEST(MessageBuffersTest, ABufferDroppedIsTakenAgainInsteadOfAllocated) {
  MessageBuffers pool;
  uint64_t* first = nullptr;
  {
    std::shared_ptr<uint64_t[]> a = pool.Take(1000);
    first = a.get();
    a[999] = 7;
    EXPECT_EQ(pool.free_buffers(), 0u);
  }
  EXPECT_EQ(pool.free_buffers(), 1u);
  // A smaller request takes the same buffer, contents as left.
  std::shared_ptr<uint64_t[]> b = pool.Take(10);
  EXPECT_EQ(b.get(), first);
  EXPECT_EQ(b[999], 7u);
  // A larger one while it is in use: a new allocation.
  std::shared_ptr<uint64_t[]> c = pool.Take(2000);
  EXPECT_NE(c.get(), first);
  EXPECT_EQ(pool.allocated(), 2);
}

TEST(MessageBuffersTest, TakesTheSmallestThatFitsAndKeepsTheLargestWhenFull) {
  MessageBuffers pool(/*max_free=*/2);
  { auto small = pool.Take(10), medium = pool.Take(100), large = pool.Take(1000); }
  // Three came back into room for two: the smallest was let go.
  EXPECT_EQ(pool.free_buffers(), 2u);
  auto fits = pool.Take(50);   // The 100-word one, not the 1000.
  auto next = pool.Take(500);  // The 1000-word one.
  EXPECT_EQ(pool.free_buffers(), 0u);
  EXPECT_EQ(pool.allocated(), 3);
  auto more = pool.Take(5);  // Nothing free: allocated.
  EXPECT_EQ(pool.allocated(), 4);
}

TEST(MessageBuffersTest, ABufferMayOutliveThePoolAndComeBackOnAnotherThread) {
  std::shared_ptr<uint64_t[]> kept;
  {
    MessageBuffers pool;
    kept = pool.Take(64);
    kept[0] = 1;
  }
  // The pool's owner is gone; the last owner drops it on another thread.
  std::thread([buffer = std::move(kept)]() mutable { buffer.reset(); }).join();
  EXPECT_EQ(kept, nullptr);
}

TEST(MessageBuffersTest, ThreadsTakingAndDroppingAtOnceShareAFewBuffers) {
  MessageBuffers pool(/*max_free=*/8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 1000; ++i) {
        std::shared_ptr<uint64_t[]> b = pool.Take(256 + t);
        b[0] = static_cast<uint64_t>(i);
        ASSERT_EQ(b[0], static_cast<uint64_t>(i));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // At most one buffer per thread at a time was ever needed.
  EXPECT_LE(pool.allocated(), 4);
  EXPECT_GE(pool.allocated(), 1);
}

}  // namespace
}  // namespace trident::transport::attention
