#include "services/worker/kv_handoff/kv_reservations.h"

#include <algorithm>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/kv/block_hasher.h"
#include "common/kv/kv_layout.h"
#include "common/kv/paged_block_allocator.h"
#include "common/kv/prefix_caching_block_allocator.h"
#include "common/testing/status_matchers.h"
#include "common/transport/kv/fake_kv_receiver.h"
#include "common/transport/kv/fake_kv_sender.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::worker {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

class AllocatorSource : public BlockSource {
 public:
  explicit AllocatorSource(int32_t n) : allocator_(n) {}
  absl::StatusOr<std::vector<int32_t>> Reserve(int32_t n) override {
    return allocator_.Allocate(n);
  }
  absl::Status Free(absl::Span<const int32_t> blocks) override { return allocator_.Free(blocks); }
  int32_t num_free() const { return allocator_.num_free(); }

 private:
  kv::PagedBlockAllocator allocator_;
};

struct Fixture {
  Fixture() : source(32), reservations(&source, &clock, Options()) {}
  static KvReservationOptions Options() {
    KvReservationOptions o;
    o.block_size = 4;
    return o;
  }
  AllocatorSource source;
  FakeClock clock;
  KvReservations reservations;
};

// Records Await's single call.
struct Result {
  std::optional<absl::StatusOr<KvHandOff>> value;
  int calls = 0;
  std::function<void(absl::StatusOr<KvHandOff>)> Callback() {
    return [this](absl::StatusOr<KvHandOff> v) {
      value = std::move(v);
      ++calls;
    };
  }
};

KvCommit Complete(int32_t token) {
  KvCommit c;
  c.outcome = KvOutcome::kComplete;
  c.first_token = token;
  return c;
}

// A placement at a CPU attention service that counts its releases.
RemotePlacement Placement(uint64_t handle, int* released) {
  return RemotePlacement{.kv = backend::RemoteKv{.handle = handle},
                         .service_id = "cpu0",
                         .release = [released] { ++*released; }};
}

TEST(KvReservationsTest, ARemotePlacementIsHandedOffOrReleasedExactlyOnce) {
  Fixture f;
  int released = 0;
  // Committed COMPLETE: the decode takes the placement, nothing released.
  auto taken = f.reservations.ReserveRemote("a", Placement(7, &released), absl::ZeroDuration());
  ASSERT_THAT(taken.status(), IsOk());
  EXPECT_TRUE(taken->blocks.empty());
  EXPECT_EQ(f.source.num_free(), 32);
  Result result;
  f.reservations.Await(taken->id, result.Callback());
  ASSERT_THAT(f.reservations.Commit(taken->id, Complete(3)), IsOk());
  ASSERT_EQ(result.calls, 1);
  ASSERT_THAT(result.value->status(), IsOk());
  ASSERT_TRUE((*result.value)->remote.has_value());
  EXPECT_EQ((*result.value)->remote->kv.handle, 7u);
  EXPECT_EQ((*result.value)->remote->service_id, "cpu0");
  EXPECT_TRUE((*result.value)->blocks.empty());
  EXPECT_EQ(released, 0);
  // Aborted, released after the writer's commit, expired: released once each.
  auto aborted = f.reservations.ReserveRemote("b", Placement(8, &released), absl::ZeroDuration());
  ASSERT_THAT(aborted.status(), IsOk());
  KvCommit abort;
  abort.outcome = KvOutcome::kAborted;
  ASSERT_THAT(f.reservations.Commit(aborted->id, abort), IsOk());
  EXPECT_EQ(released, 1);
  auto given_up = f.reservations.ReserveRemote("c", Placement(9, &released), absl::ZeroDuration());
  ASSERT_THAT(given_up.status(), IsOk());
  EXPECT_TRUE(f.reservations.Release(given_up->id));
  EXPECT_EQ(released, 1);  // The writer may still be writing.
  ASSERT_THAT(f.reservations.Commit(given_up->id, Complete(3)), IsOk());
  EXPECT_EQ(released, 2);
  auto expiring = f.reservations.ReserveRemote("d", Placement(10, &released), absl::Seconds(1));
  ASSERT_THAT(expiring.status(), IsOk());
  f.clock.Advance(absl::Seconds(2));
  EXPECT_EQ(f.reservations.ExpireLeases(), 1);
  EXPECT_EQ(released, 3);
  // No KV message lands in a remote reservation.
  auto remote = f.reservations.ReserveRemote("e", Placement(11, &released), absl::ZeroDuration());
  ASSERT_THAT(remote.status(), IsOk());
  EXPECT_THAT(
      f.reservations.WriteMessage(
          remote->id, [](absl::Span<const int32_t>) -> absl::StatusOr<int64_t> { return 1; }),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("attention service cpu0")));
  // A bad request releases the placement it was given.
  EXPECT_THAT(f.reservations.ReserveRemote("", Placement(12, &released), absl::ZeroDuration()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(released, 4);
}

TEST(KvReservationsTest, IdsAreUnguessableTickets) {
  // KV messages over UCX name their reservation: ids must not be guessable
  // from one another (no counter), nor repeat or be zero.
  Fixture f;
  std::set<uint64_t> ids;
  int adjacent = 0;
  uint64_t last = 0;
  for (int i = 0; i < 200; ++i) {
    auto r = f.reservations.Reserve(absl::StrCat("req", i), 4, absl::ZeroDuration());
    ASSERT_THAT(r, IsOk());
    EXPECT_NE(r->id, 0u);
    EXPECT_TRUE(ids.insert(r->id).second) << r->id;
    if (r->id == last + 1 || last == r->id + 1) ++adjacent;
    last = r->id;
    // Its lease ends: the blocks come back for the next one.
    f.clock.Advance(absl::Hours(1));
    EXPECT_EQ(f.reservations.ExpireLeases(), 1);
  }
  EXPECT_EQ(adjacent, 0);
}

TEST(KvReservationsTest, CommitHandsTheBlocksToTheWaitingDecode) {
  Fixture f;
  auto r = f.reservations.Reserve("req", 9, absl::ZeroDuration());  // 3 blocks of 4
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->blocks.size(), 3u);
  EXPECT_NE(r->id, 0u);
  EXPECT_EQ(r->lease, absl::Seconds(30));
  EXPECT_EQ(f.source.num_free(), 29);
  Result result;
  f.reservations.Await(r->id, result.Callback());
  EXPECT_EQ(result.calls, 0);
  ASSERT_THAT(f.reservations.Commit(r->id, Complete(42)), IsOk());
  ASSERT_EQ(result.calls, 1);
  ASSERT_THAT(result.value->status(), IsOk());
  EXPECT_EQ((*result.value)->commit.first_token, 42);
  EXPECT_EQ((*result.value)->blocks, r->blocks);
  // The blocks are the decode's now: not held, not freed.
  EXPECT_EQ(f.reservations.blocks_held(), 0);
  EXPECT_EQ(f.source.num_free(), 29);
  EXPECT_THAT(f.reservations.Commit(r->id, Complete(1)), StatusIs(absl::StatusCode::kNotFound));
}

TEST(KvReservationsTest, AwaitAfterCommitTakesTheBlocksAtOnce) {
  Fixture f;
  auto r = f.reservations.Reserve("req", 4, absl::ZeroDuration());
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_THAT(f.reservations.Commit(r->id, Complete(7)), IsOk());
  EXPECT_THAT(f.reservations.Commit(r->id, Complete(7)),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(f.reservations.Renew(r->id, absl::ZeroDuration()).status(),
              StatusIs(absl::StatusCode::kNotFound));
  Result result;
  f.reservations.Await(r->id, result.Callback());
  ASSERT_EQ(result.calls, 1);
  ASSERT_THAT(result.value->status(), IsOk());
  EXPECT_EQ((*result.value)->blocks.size(), 1u);
}

TEST(KvReservationsTest, FinishedAndAbortedCommitsFreeTheBlocks) {
  Fixture f;
  auto a = f.reservations.Reserve("a", 8, absl::ZeroDuration());
  auto b = f.reservations.Reserve("b", 8, absl::ZeroDuration());
  ASSERT_THAT(a.status(), IsOk());
  ASSERT_THAT(b.status(), IsOk());
  Result ra, rb;
  f.reservations.Await(a->id, ra.Callback());
  f.reservations.Await(b->id, rb.Callback());
  KvCommit finished;
  finished.outcome = KvOutcome::kFinished;
  finished.first_token = 2;
  ASSERT_THAT(f.reservations.Commit(a->id, finished), IsOk());
  KvCommit aborted;
  aborted.outcome = KvOutcome::kAborted;
  aborted.error = "layer 3 put failed";
  ASSERT_THAT(f.reservations.Commit(b->id, aborted), IsOk());
  ASSERT_THAT(ra.value->status(), IsOk());
  EXPECT_EQ((*ra.value)->commit.outcome, KvOutcome::kFinished);
  EXPECT_TRUE((*ra.value)->blocks.empty());
  EXPECT_THAT(rb.value->status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("layer 3 put failed")));
  EXPECT_EQ(f.source.num_free(), 32);
  EXPECT_EQ(f.reservations.num_reservations(), 0);
}

TEST(KvReservationsTest, IsPendingUntilTheReservationIsTakenOrEnds) {
  Fixture f;
  auto taken = f.reservations.Reserve("taken", 4, absl::ZeroDuration());
  auto finished = f.reservations.Reserve("finished", 4, absl::ZeroDuration());
  auto released = f.reservations.Reserve("released", 4, absl::Seconds(1));
  auto expired = f.reservations.Reserve("expired", 4, absl::Seconds(1));
  for (auto* r : {&taken, &finished, &released, &expired}) {
    ASSERT_THAT(r->status(), IsOk());
    EXPECT_TRUE(f.reservations.IsPending((*r)->id));
  }
  EXPECT_FALSE(f.reservations.IsPending(12345));
  // Committed COMPLETE: pending until a decode takes the blocks.
  ASSERT_THAT(f.reservations.Commit(taken->id, Complete(3)), IsOk());
  EXPECT_TRUE(f.reservations.IsPending(taken->id));
  Result result;
  f.reservations.Await(taken->id, result.Callback());
  EXPECT_FALSE(f.reservations.IsPending(taken->id));
  KvCommit done;
  done.outcome = KvOutcome::kFinished;
  done.first_token = 2;
  ASSERT_THAT(f.reservations.Commit(finished->id, done), IsOk());
  // Its outcome waits for the Decode call.
  EXPECT_TRUE(f.reservations.IsPending(finished->id));
  Result outcome;
  f.reservations.Await(finished->id, outcome.Callback());
  EXPECT_EQ(outcome.calls, 1);
  EXPECT_FALSE(f.reservations.IsPending(finished->id));
  // Released while the writer may still write: kept, but no longer pending.
  EXPECT_TRUE(f.reservations.Release(released->id));
  EXPECT_FALSE(f.reservations.IsPending(released->id));
  f.clock.Advance(absl::Seconds(1));
  EXPECT_EQ(f.reservations.ExpireLeases(), 2);
  EXPECT_FALSE(f.reservations.IsPending(expired->id));
}

TEST(KvReservationsTest, LeasesEndUnlessRenewed) {
  Fixture f;
  auto r = f.reservations.Reserve("req", 5, absl::Seconds(10));
  ASSERT_THAT(r.status(), IsOk());
  Result result;
  f.reservations.Await(r->id, result.Callback());
  f.clock.Advance(absl::Seconds(8));
  EXPECT_EQ(f.reservations.ExpireLeases(), 0);
  auto renewed = f.reservations.Renew(r->id, absl::Seconds(10));
  ASSERT_THAT(renewed.status(), IsOk());
  EXPECT_EQ(*renewed, f.clock.Now() + absl::Seconds(10));
  f.clock.Advance(absl::Seconds(8));
  EXPECT_EQ(f.reservations.ExpireLeases(), 0);
  EXPECT_EQ(result.calls, 0);
  f.clock.Advance(absl::Seconds(2));
  EXPECT_EQ(f.reservations.ExpireLeases(), 1);
  ASSERT_EQ(result.calls, 1);
  EXPECT_THAT(result.value->status(), StatusIs(absl::StatusCode::kAborted, HasSubstr("lease")));
  EXPECT_EQ(f.source.num_free(), 32);
  EXPECT_THAT(f.reservations.Commit(r->id, Complete(1)), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(f.reservations.Renew(r->id, absl::ZeroDuration()).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(KvReservationsTest, ACommitAfterTheLeaseEndedIsRefusedAndFreesTheBlocks) {
  Fixture f;
  auto r = f.reservations.Reserve("req", 5, absl::Seconds(1));
  ASSERT_THAT(r.status(), IsOk());
  Result result;
  f.reservations.Await(r->id, result.Callback());
  f.clock.Advance(absl::Seconds(1));
  EXPECT_THAT(f.reservations.Commit(r->id, Complete(1)), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(result.value->status(), StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(f.source.num_free(), 32);
}

// Released before the writer committed: the waiting decode fails at once,
// but the blocks stay out of the pool until the writer's commit.
TEST(KvReservationsTest, ReleaseKeepsBlocksUntilTheWriterIsDone) {
  Fixture f;
  auto r = f.reservations.Reserve("req", 12, absl::ZeroDuration());
  ASSERT_THAT(r.status(), IsOk());
  Result result;
  f.reservations.Await(r->id, result.Callback());
  EXPECT_TRUE(f.reservations.Release(r->id));
  EXPECT_FALSE(f.reservations.Release(r->id));
  EXPECT_THAT(result.value->status(), StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(f.reservations.blocks_held(), 3);
  EXPECT_EQ(f.source.num_free(), 29);
  ASSERT_THAT(f.reservations.Commit(r->id, Complete(5)), IsOk());
  EXPECT_EQ(f.source.num_free(), 32);
  // Released and never committed: the lease's end frees it.
  auto s = f.reservations.Reserve("req2", 4, absl::Seconds(5));
  ASSERT_THAT(s.status(), IsOk());
  EXPECT_TRUE(f.reservations.Release(s->id));
  Result late;
  f.reservations.Await(s->id, late.Callback());
  EXPECT_THAT(late.value->status(), StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(f.source.num_free(), 31);
  f.clock.Advance(absl::Seconds(5));
  EXPECT_EQ(f.reservations.ExpireLeases(), 1);
  EXPECT_EQ(f.source.num_free(), 32);
}

TEST(KvReservationsTest, BadRequestsAreRefusedWithTheFieldNamed) {
  // Before the fixture: its destructor answers the waiter still pending.
  Result first, second, unknown;
  Fixture f;
  EXPECT_THAT(f.reservations.Reserve("", 4, absl::ZeroDuration()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("request_id")));
  EXPECT_THAT(f.reservations.Reserve("r", 0, absl::ZeroDuration()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_tokens")));
  EXPECT_THAT(f.reservations.Reserve("r", 4, absl::Seconds(-1)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lease")));
  EXPECT_THAT(f.reservations.Reserve("r", 4 * 33, absl::ZeroDuration()).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("33 KV blocks")));
  auto capped = f.reservations.Reserve("r", 4, absl::Hours(1));
  ASSERT_THAT(capped.status(), IsOk());
  EXPECT_EQ(capped->lease, absl::Minutes(10));
  KvCommit no_token;
  EXPECT_THAT(f.reservations.Commit(capped->id, no_token),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("first_token")));
  f.reservations.Await(capped->id, first.Callback());
  f.reservations.Await(capped->id, second.Callback());
  EXPECT_THAT(second.value->status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  f.reservations.Await(999, unknown.Callback());
  EXPECT_THAT(unknown.value->status(), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(first.calls, 0);
}

TEST(KvReservationsTest, ShutdownFailsWaitersAndFreesEverything) {
  AllocatorSource source(32);
  FakeClock clock;
  Result result;
  {
    KvReservations reservations(&source, &clock, Fixture::Options());
    auto r = reservations.Reserve("req", 16, absl::ZeroDuration());
    ASSERT_THAT(r.status(), IsOk());
    reservations.Await(r->id, result.Callback());
  }
  EXPECT_THAT(result.value->status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(source.num_free(), 32);
}

// Writes that arrive as messages see the reservation's blocks only while it
// accepts writes, and are counted for the commit.
TEST(KvReservationsTest, MessagesWriteOnlyIntoALiveReservationAndAreCounted) {
  Fixture f;
  auto r = f.reservations.Reserve("req", 9, absl::Seconds(5));
  ASSERT_THAT(r.status(), IsOk());
  std::vector<int32_t> seen;
  auto write = [&](int64_t bytes) {
    return f.reservations.WriteMessage(
        r->id, [&](absl::Span<const int32_t> blocks) -> absl::StatusOr<int64_t> {
          seen.assign(blocks.begin(), blocks.end());
          return bytes;
        });
  };
  EXPECT_THAT(write(100), IsOk());
  EXPECT_EQ(seen, r->blocks);
  EXPECT_THAT(f.reservations.AwaitBytes(r->id, 250, absl::Now()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("only 100 of the 250")));
  EXPECT_THAT(write(150), IsOk());
  EXPECT_THAT(f.reservations.AwaitBytes(r->id, 250, absl::Now()), IsOk());
  // A write the callback refuses is not counted.
  EXPECT_THAT(f.reservations.WriteMessage(r->id,
                                          [](absl::Span<const int32_t>) -> absl::StatusOr<int64_t> {
                                            return absl::InvalidArgumentError("outside the blocks");
                                          }),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(f.reservations.AwaitBytes(r->id, 251, absl::Now()),
              StatusIs(absl::StatusCode::kDeadlineExceeded));

  // Once committed, late messages are refused and never touch the blocks.
  ASSERT_THAT(f.reservations.Commit(r->id, Complete(7)), IsOk());
  seen.clear();
  EXPECT_THAT(write(10), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_TRUE(seen.empty());
  EXPECT_THAT(f.reservations.AwaitBytes(r->id, 1, absl::Now()),
              StatusIs(absl::StatusCode::kNotFound));
}

// OnBytes answers once, from wherever the answer comes: at once, from the
// write that completes the bytes, from the end of the reservation, or from
// the lease check after its deadline.
TEST(KvReservationsTest, OnBytesAnswersOnceWithoutBlocking) {
  Fixture f;
  std::vector<absl::Status> answers;
  auto record = [&answers](absl::Status s) { answers.push_back(std::move(s)); };
  auto r = f.reservations.Reserve("req", 9, absl::Seconds(5));
  ASSERT_THAT(r.status(), IsOk());
  auto write = [&](uint64_t id, int64_t bytes) {
    return f.reservations.WriteMessage(
        id, [bytes](absl::Span<const int32_t>) -> absl::StatusOr<int64_t> { return bytes; });
  };
  ASSERT_THAT(write(r->id, 100), IsOk());
  f.reservations.OnBytes(r->id, 100, f.clock.Now() + absl::Seconds(1), record);
  ASSERT_EQ(answers.size(), 1u);  // Already in.
  EXPECT_THAT(answers[0], IsOk());

  // Completed by a later write; a second waiter meanwhile is refused.
  f.reservations.OnBytes(r->id, 250, f.clock.Now() + absl::Seconds(1), record);
  f.reservations.OnBytes(r->id, 250, f.clock.Now() + absl::Seconds(1), record);
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_THAT(answers[1], StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(write(r->id, 100), IsOk());
  EXPECT_EQ(answers.size(), 2u);
  ASSERT_THAT(write(r->id, 50), IsOk());
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_THAT(answers[2], IsOk());

  // The deadline, seen by the lease check.
  f.reservations.OnBytes(r->id, 1000, f.clock.Now() + absl::Seconds(1), record);
  EXPECT_EQ(f.reservations.ExpireLeases(), 0);
  EXPECT_EQ(answers.size(), 3u);
  f.clock.Advance(absl::Seconds(2));
  EXPECT_EQ(f.reservations.ExpireLeases(), 0);
  ASSERT_EQ(answers.size(), 4u);
  EXPECT_THAT(answers[3],
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("only 250 of the 1000")));

  // The reservation ends (released, committed, expired): NOT_FOUND.
  auto released = f.reservations.Reserve("a", 4, absl::Seconds(5));
  auto committed = f.reservations.Reserve("b", 4, absl::Seconds(5));
  auto expired = f.reservations.Reserve("c", 4, absl::Seconds(1));
  for (const auto* x : {&released, &committed, &expired}) {
    ASSERT_THAT(x->status(), IsOk());
    f.reservations.OnBytes((*x)->id, 1, f.clock.Now() + absl::Seconds(30), record);
  }
  EXPECT_EQ(answers.size(), 4u);
  f.reservations.Release(released->id);
  ASSERT_THAT(f.reservations.Commit(committed->id, Complete(7)), IsOk());
  f.clock.Advance(absl::Seconds(2));
  f.reservations.ExpireLeases();
  ASSERT_EQ(answers.size(), 7u);
  for (size_t i = 4; i < 7; ++i) EXPECT_THAT(answers[i], StatusIs(absl::StatusCode::kNotFound));
  // Unknown: at once.
  f.reservations.OnBytes(12345, 1, f.clock.Now(), record);
  ASSERT_EQ(answers.size(), 8u);
  EXPECT_THAT(answers[7], StatusIs(absl::StatusCode::kNotFound));
}

TEST(KvReservationsTest, MessagesAfterReleaseOrLeaseEndAreDropped) {
  Fixture f;
  auto released = f.reservations.Reserve("a", 4, absl::Seconds(5));
  auto expired = f.reservations.Reserve("b", 4, absl::Seconds(1));
  ASSERT_THAT(released.status(), IsOk());
  ASSERT_THAT(expired.status(), IsOk());
  int calls = 0;
  auto write = [&](uint64_t id) {
    return f.reservations.WriteMessage(id,
                                       [&](absl::Span<const int32_t>) -> absl::StatusOr<int64_t> {
                                         ++calls;
                                         return 1;
                                       });
  };
  EXPECT_TRUE(f.reservations.Release(released->id));
  EXPECT_THAT(write(released->id), StatusIs(absl::StatusCode::kNotFound));
  f.clock.Advance(absl::Seconds(2));
  EXPECT_THAT(write(expired->id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(write(12345), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(calls, 0);
}

TEST(KvReservationsTest, AReservationEndingDuringAMessageWriteFreesItsBlocksAfterTheWrite) {
  // Writes run without the lock; one still copying pins the blocks.
  Fixture f;
  auto expired = f.reservations.Reserve("a", 4, absl::Seconds(1));
  auto released = f.reservations.Reserve("b", 4, absl::Seconds(5));
  ASSERT_THAT(expired.status(), IsOk());
  ASSERT_THAT(released.status(), IsOk());
  const int32_t free_before = f.source.num_free();
  int32_t free_during = -1;
  int32_t held_during = -1;
  // The lease ends mid-write.
  EXPECT_THAT(
      f.reservations.WriteMessage(expired->id,
                                  [&](absl::Span<const int32_t>) -> absl::StatusOr<int64_t> {
                                    f.clock.Advance(absl::Seconds(2));
                                    EXPECT_EQ(f.reservations.ExpireLeases(), 1);
                                    free_during = f.source.num_free();
                                    held_during = f.reservations.blocks_held();
                                    return 8;
                                  }),
      IsOk());
  EXPECT_EQ(free_during, free_before) << "freed while a write ran into them";
  EXPECT_EQ(held_during, 2) << "still counted as held";
  EXPECT_EQ(f.source.num_free(), free_before + 1);

  // A commit and a release (nobody takes the blocks) mid-write: a sender
  // whose commit ran ahead of its last message.
  ASSERT_THAT(f.reservations.Renew(released->id, absl::Seconds(5)).status(), IsOk());
  EXPECT_THAT(f.reservations.WriteMessage(
                  released->id,
                  [&](absl::Span<const int32_t>) -> absl::StatusOr<int64_t> {
                    EXPECT_THAT(f.reservations.Commit(released->id, Complete(7)), IsOk());
                    EXPECT_TRUE(f.reservations.Release(released->id));
                    free_during = f.source.num_free();
                    return 8;
                  }),
              IsOk());
  EXPECT_EQ(free_during, free_before + 1);
  EXPECT_EQ(f.source.num_free(), free_before + 2);
  EXPECT_EQ(f.reservations.blocks_held(), 0);
}

// The reservations are the transport's KvMessageSink: KV sent as messages
// lands in a live reservation's blocks and counts towards its commit; once
// the reservation is released, its messages are dropped.
TEST(KvReservationsTest, TakesTheTransportsMessagesWhileTheReservationLives) {
  Fixture f;
  const kv::KvCacheSpec spec = {.num_layers = 2,
                                .num_kv_heads = 1,
                                .head_dim = 8,
                                .block_size = 4,
                                .dtype = numeric::DType::kF32,
                                .num_blocks = 32};
  std::vector<uint8_t> local(spec.TotalBytes());
  for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<uint8_t>(i % 253 + 1);
  transport::FakeKvReceiver receiver("decode-0", 1, spec, &f.reservations);
  transport::FakeKvSender sender(spec, local.data());
  sender.AddPeer(&receiver);
  auto send = [&](const KvReservations::Reservation& r) {
    trident::v1::KvDestination d;
    EXPECT_THAT(receiver.Describe(&d), IsOk());
    d.set_reservation_id(r.id);
    d.set_num_tokens(6);
    for (int32_t b : r.blocks) d.add_block_ids(b);
    auto transfer = sender.Open(d);
    EXPECT_THAT(transfer.status(), IsOk());
    for (int32_t layer = 0; layer < spec.num_layers; ++layer) {
      (*transfer)->SendLayer(layer, {0, 1}, [](absl::Status s) { EXPECT_THAT(s, IsOk()); });
    }
    return (*transfer)->message_bytes();
  };
  auto kept = f.reservations.Reserve("kept", 6, absl::ZeroDuration());
  auto released = f.reservations.Reserve("released", 6, absl::ZeroDuration());
  ASSERT_THAT(kept.status(), IsOk());
  ASSERT_THAT(released.status(), IsOk());
  ASSERT_TRUE(f.reservations.Release(released->id));

  const int64_t kept_bytes = send(*kept);
  send(*released);

  EXPECT_THAT(f.reservations.AwaitBytes(kept->id, kept_bytes, absl::Now()), IsOk());
  EXPECT_EQ(receiver.dropped_messages(), 2);  // One message per layer.
  const uint64_t stride = spec.block_stride_bytes();
  EXPECT_TRUE(std::equal(local.begin() + spec.KeyOffsetBytes(1, 1),
                         local.begin() + spec.KeyOffsetBytes(1, 1) + stride,
                         receiver.pool().begin() + spec.KeyOffsetBytes(1, kept->blocks[1])));
}

}  // namespace
}  // namespace trident::worker

namespace trident::worker {
namespace {

// A source over a prefix-caching allocator whose cache holds one chain.
class CachingSource : public BlockSource {
 public:
  CachingSource() : allocator_(16), hasher_(4, "m") {}
  // Caches `tokens`' whole blocks as a finished sequence would.
  void Cache(const std::vector<int32_t>& tokens) {
    const std::vector<kv::BlockKey> keys = hasher_.PrefixKeys("", tokens);
    auto blocks = allocator_.Allocate(static_cast<int32_t>(keys.size()));
    ASSERT_THAT(blocks.status(), IsOk());
    for (size_t i = 0; i < keys.size(); ++i) allocator_.Publish((*blocks)[i], keys[i]);
    ASSERT_THAT(allocator_.Free(*blocks), IsOk());
  }
  absl::StatusOr<std::vector<int32_t>> Reserve(int32_t n) override {
    return allocator_.Allocate(n);
  }
  absl::Status Free(absl::Span<const int32_t> blocks) override { return allocator_.Free(blocks); }
  std::vector<int32_t> AcquireCached(absl::Span<const int32_t> tokens, const std::string& salt,
                                     int32_t max_blocks) override {
    return allocator_.AcquireCached(
        hasher_.PrefixKeys(salt, tokens, static_cast<size_t>(max_blocks)));
  }
  kv::PrefixCachingBlockAllocator& allocator() { return allocator_; }

 private:
  kv::PrefixCachingBlockAllocator allocator_;
  kv::BlockHasher hasher_;
};

TEST(KvReservationsPrefixTest, ReservesOnlyWhatTheCacheLacksAndMessagesWriteOnlyThat) {
  CachingSource source;
  FakeClock clock;
  KvReservations reservations(&source, &clock, Fixture::Options());
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // 2 whole blocks + 2.
  source.Cache({1, 2, 3, 4, 5, 6, 7, 8});
  auto r = reservations.Reserve("a", 10, absl::ZeroDuration(), prompt);
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_EQ(r->num_cached_blocks, 2);
  ASSERT_EQ(r->blocks.size(), 3u);
  // A message write sees only the writer's block.
  std::vector<int32_t> writable;
  ASSERT_THAT(reservations.WriteMessage(r->id,
                                        [&](absl::Span<const int32_t> blocks) {
                                          writable.assign(blocks.begin(), blocks.end());
                                          return absl::StatusOr<int64_t>(0);
                                        }),
              IsOk());
  EXPECT_EQ(writable, std::vector<int32_t>{r->blocks[2]});
  // Another salt shares nothing.
  auto salted = reservations.Reserve("b", 10, absl::ZeroDuration(), prompt, "tenant");
  ASSERT_THAT(salted.status(), IsOk());
  EXPECT_EQ(salted->num_cached_blocks, 0);
  // Released, the shared blocks go back to the cache, nothing leaks.
  EXPECT_TRUE(reservations.Release(salted->id));
  Result result;
  reservations.Await(r->id, result.Callback());
  ASSERT_THAT(reservations.Commit(r->id, Complete(7)), IsOk());
  ASSERT_TRUE(result.value.has_value() && result.value->ok());
  EXPECT_EQ((*result.value)->blocks, r->blocks);
  ASSERT_THAT(source.Free((*result.value)->blocks), IsOk());
  // The released one keeps its blocks until its lease ends (its writer may
  // still write).
  EXPECT_EQ(source.allocator().num_used(), 3);
  clock.Advance(absl::Minutes(11));
  reservations.ExpireLeases();
  EXPECT_EQ(source.allocator().num_used(), 0);
  EXPECT_EQ(source.allocator().num_cached(), 2);
  EXPECT_THAT(source.allocator().CheckInvariants(), IsOk());
}

TEST(KvReservationsPrefixTest, APromptOfAnotherLengthIsRefusedAndAFullPoolTakesNothing) {
  CachingSource source;
  FakeClock clock;
  KvReservations reservations(&source, &clock, Fixture::Options());
  EXPECT_THAT(reservations.Reserve("a", 5, absl::ZeroDuration(), std::vector<int32_t>{1, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  source.Cache({1, 2, 3, 4});
  // 15 blocks held elsewhere: the cached one is taken, the other 4 are not
  // free, and the cached one goes back.
  auto held = source.Reserve(15);
  ASSERT_THAT(held.status(), IsOk());
  EXPECT_THAT(reservations.Reserve("b", 20, absl::ZeroDuration(),
                                   std::vector<int32_t>(
                                       {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
                                        18, 19, 20})),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(source.allocator().num_cached(), 1);
  ASSERT_THAT(source.Free(*held), IsOk());
  EXPECT_THAT(source.allocator().CheckInvariants(), IsOk());
}

}  // namespace
}  // namespace trident::worker
