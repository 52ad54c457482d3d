#include "services/attention/kv_store/sequence_store.h"

#include <cstdint>
#include <vector>

#include "common/testing/status_matchers.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/attention/kv_store/heap_kv_pool.h"

namespace trident::attention {
namespace {

using ::testing::HasSubstr;
using testing::IsOk;
using testing::IsOkAndHolds;
using testing::StatusIs;

SequenceSpec Spec(const std::string& owner, uint64_t incarnation, const std::string& id,
                  int32_t capacity_tokens = 40) {
  return SequenceSpec{.owner_id = owner,
                      .owner_incarnation = incarnation,
                      .sequence_id = id,
                      .num_layers = 2,
                      .num_q_heads = 4,
                      .num_kv_heads = 2,
                      .head_dim = 16,
                      .dtype = numeric::DType::kBF16,
                      .capacity_tokens = capacity_tokens,
                      .block_size = 16,
                      .packing = KvPacking::kRows};
}

// 2 layers x 3 blocks x (K + V) x 2 heads x 16 tokens x 16 dims x 2 bytes.
constexpr size_t kSpecBytes = 2 * 3 * 2 * 2 * 16 * 16 * 2;

class SequenceStoreTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  HeapKvPool pool_{8 * kSpecBytes};
  SequenceStore store_{&pool_, &clock_,
                       SequenceStoreOptions{.reconnect_grace = absl::Seconds(5),
                                            .default_idle_timeout = absl::Seconds(60)}};
};

TEST_F(SequenceStoreTest, AdmitLaysOutWholeBlocksOfEveryLayer) {
  ASSERT_THAT(store_.Connect("w0", 7), IsOkAndHolds(0));
  absl::StatusOr<AdmittedSequence> admitted = store_.Admit(Spec("w0", 7, "r1"));
  ASSERT_THAT(admitted, IsOk());
  EXPECT_NE(admitted->handle, 0u);
  EXPECT_EQ(admitted->layout.capacity_tokens, 48);
  EXPECT_EQ(admitted->layout.value_offset_bytes, 2u * 16 * 16 * 2);
  EXPECT_EQ(admitted->layout.block_stride_bytes, 2 * admitted->layout.value_offset_bytes);
  EXPECT_EQ(admitted->layout.layer_stride_bytes, 3 * admitted->layout.block_stride_bytes);
  EXPECT_EQ(admitted->reserved_bytes, kSpecBytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(admitted->data) % 64, 0u);
  SequenceStoreStats stats = store_.Stats();
  EXPECT_EQ(stats.sequences, 1);
  EXPECT_EQ(stats.held_bytes, static_cast<int64_t>(kSpecBytes));
  EXPECT_EQ(stats.sessions, 1);
}

TEST_F(SequenceStoreTest, Bf16DefaultsToVnniPairsInBlocksOf32AndOthersToRowsOf16) {
  ASSERT_THAT(store_.Connect("w0", 7), IsOk());
  SequenceSpec spec = Spec("w0", 7, "pairs");
  spec.packing = KvPacking::kAuto;
  spec.block_size = 0;
  absl::StatusOr<AdmittedSequence> pairs = store_.Admit(spec);
  ASSERT_THAT(pairs, IsOk());
  EXPECT_EQ(pairs->layout.packing, KvPacking::kPairs);
  EXPECT_EQ(pairs->layout.block_size, 32);
  EXPECT_EQ(pairs->layout.capacity_tokens, 64);
  EXPECT_EQ(pairs->layout.value_offset_bytes, 2u * 32 * 16 * 2);

  spec.sequence_id = "pairs-40";
  spec.block_size = 40;  // Rounded up to a multiple of 32.
  absl::StatusOr<AdmittedSequence> rounded = store_.Admit(spec);
  ASSERT_THAT(rounded, IsOk());
  EXPECT_EQ(rounded->layout.block_size, 64);

  spec.sequence_id = "f32";
  spec.dtype = numeric::DType::kF32;
  spec.block_size = 0;
  spec.capacity_tokens = 8;
  absl::StatusOr<AdmittedSequence> rows = store_.Admit(spec);
  ASSERT_THAT(rows, IsOk());
  EXPECT_EQ(rows->layout.packing, KvPacking::kRows);
  EXPECT_EQ(rows->layout.block_size, 16);

  spec.sequence_id = "f32-pairs";
  spec.packing = KvPacking::kPairs;
  EXPECT_THAT(store_.Admit(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs bf16")));
  spec.packing = KvPacking::kAuto;
  spec.block_size = -1;
  EXPECT_THAT(store_.Admit(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_size_tokens")));
}

TEST_F(SequenceStoreTest, AdmitNeedsASessionOfTheSameIncarnation) {
  EXPECT_THAT(store_.Admit(Spec("w0", 7, "r1")),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("Connect")));
  ASSERT_THAT(store_.Connect("w0", 7), IsOk());
  EXPECT_THAT(store_.Admit(Spec("w0", 8, "r1")),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("incarnation 8")));
}

TEST_F(SequenceStoreTest, RejectsBadShapesNamingTheField) {
  ASSERT_THAT(store_.Connect("w0", 7), IsOk());
  SequenceSpec spec = Spec("w0", 7, "r1");
  spec.num_q_heads = 3;
  EXPECT_THAT(store_.Admit(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_kv_heads")));
  spec = Spec("w0", 7, "r1");
  spec.head_dim = 24;
  EXPECT_THAT(store_.Admit(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head_dim")));
  spec = Spec("w0", 7, "");
  EXPECT_THAT(store_.Admit(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("sequence_id")));
  spec = Spec("w0", 7, "r1", /*capacity_tokens=*/0);
  EXPECT_THAT(store_.Admit(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("capacity_tokens")));
  EXPECT_EQ(pool_.used_bytes(), 0u);
}

TEST_F(SequenceStoreTest, DuplicateSequenceIdIsAlreadyExists) {
  ASSERT_THAT(store_.Connect("w0", 7), IsOk());
  ASSERT_THAT(store_.Admit(Spec("w0", 7, "r1")), IsOk());
  EXPECT_THAT(store_.Admit(Spec("w0", 7, "r1")), StatusIs(absl::StatusCode::kAlreadyExists));
  // Another owner may use the same id.
  ASSERT_THAT(store_.Connect("w1", 9), IsOk());
  EXPECT_THAT(store_.Admit(Spec("w1", 9, "r1")), IsOk());
  EXPECT_EQ(pool_.used_bytes(), 2 * kSpecBytes);
}

TEST_F(SequenceStoreTest, BudgetExhaustedIsResourceExhaustedAndReleaseMakesRoom) {
  ASSERT_THAT(store_.Connect("w0", 7), IsOk());
  std::vector<uint64_t> handles;
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<AdmittedSequence> admitted = store_.Admit(Spec("w0", 7, absl::StrCat("r", i)));
    ASSERT_THAT(admitted, IsOk());
    handles.push_back(admitted->handle);
  }
  EXPECT_THAT(store_.Admit(Spec("w0", 7, "r8")),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("budget")));
  EXPECT_THAT(store_.Release("w0", 7, handles[3]), IsOkAndHolds(kSpecBytes));
  EXPECT_THAT(store_.Release("w0", 7, handles[3]), IsOkAndHolds(0));
  EXPECT_THAT(store_.Admit(Spec("w0", 7, "r8")), IsOk());
}

TEST_F(SequenceStoreTest, ReleaseOfAnotherOwnersHandleFreesNothing) {
  ASSERT_THAT(store_.Connect("w0", 7), IsOk());
  ASSERT_THAT(store_.Connect("w1", 9), IsOk());
  absl::StatusOr<AdmittedSequence> admitted = store_.Admit(Spec("w0", 7, "r1"));
  ASSERT_THAT(admitted, IsOk());
  EXPECT_THAT(store_.Release("w1", 9, admitted->handle), IsOkAndHolds(0));
  EXPECT_EQ(store_.Stats().sequences, 1);
}

TEST_F(SequenceStoreTest, NewIncarnationEndsTheOldSession) {
  ASSERT_THAT(store_.Connect("w0", 7), IsOk());
  ASSERT_THAT(store_.Admit(Spec("w0", 7, "r1")), IsOk());
  ASSERT_THAT(store_.Admit(Spec("w0", 7, "r2")), IsOk());
  EXPECT_THAT(store_.Connect("w0", 7), IsOkAndHolds(0));  // Idempotent.
  EXPECT_THAT(store_.Connect("w0", 8), IsOkAndHolds(2));
  EXPECT_EQ(pool_.used_bytes(), 0u);
  EXPECT_EQ(store_.Stats().freed_session_ended, 2);
  EXPECT_THAT(store_.Admit(Spec("w0", 8, "r1")), IsOk());
}

TEST_F(SequenceStoreTest, UnreachableOwnerLosesItsSequencesAfterTheGrace) {
  ASSERT_THAT(store_.Connect("w0", 7), IsOk());
  ASSERT_THAT(store_.Admit(Spec("w0", 7, "r1")), IsOk());
  store_.OwnerUnreachable("w0", 7);
  clock_.Advance(absl::Seconds(4));
  EXPECT_EQ(store_.Sweep(), 0);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(store_.Sweep(), 1);
  EXPECT_EQ(pool_.used_bytes(), 0u);
  EXPECT_EQ(store_.Stats().sessions, 0);
  EXPECT_THAT(store_.Admit(Spec("w0", 7, "r2")), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(SequenceStoreTest, ReconnectWithinTheGraceKeepsTheSequences) {
  ASSERT_THAT(store_.Connect("w0", 7), IsOk());
  ASSERT_THAT(store_.Admit(Spec("w0", 7, "r1")), IsOk());
  store_.OwnerUnreachable("w0", 7);
  store_.OwnerUnreachable("w1", 7);  // Unknown owner: no effect.
  clock_.Advance(absl::Seconds(4));
  ASSERT_THAT(store_.Connect("w0", 7), IsOkAndHolds(0));
  clock_.Advance(absl::Seconds(10));
  EXPECT_EQ(store_.Sweep(), 0);
  EXPECT_EQ(store_.Stats().sequences, 1);
}

TEST_F(SequenceStoreTest, PinChecksHandlesIncarnationAndPosition) {
  ASSERT_THAT(store_.Connect("w0", 7), IsOk());
  absl::StatusOr<AdmittedSequence> a = store_.Admit(Spec("w0", 7, "r1"));
  ASSERT_THAT(a, IsOk());
  std::vector<PinnedSequence> out(1);
  const std::vector<uint64_t> handles = {a->handle};
  EXPECT_THAT(
      store_.Pin({.owner_incarnation = 7}, handles, std::vector<int32_t>{48}, absl::MakeSpan(out)),
      StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("capacity of 48")));
  EXPECT_THAT(
      store_.Pin({.owner_incarnation = 8}, handles, std::vector<int32_t>{0}, absl::MakeSpan(out)),
      StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(store_.Pin({.owner_incarnation = 7}, std::vector<uint64_t>{a->handle + 1},
                         std::vector<int32_t>{0}, absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kNotFound));
  ASSERT_THAT(
      store_.Pin({.owner_incarnation = 7}, handles, std::vector<int32_t>{46}, absl::MakeSpan(out)),
      IsOk());
  EXPECT_EQ(out[0].data, a->data);
  EXPECT_EQ(out[0].layout->capacity_tokens, 48);
  store_.Unpin(handles);
  EXPECT_EQ(store_.Stats().held_tokens, 47);
}

TEST_F(SequenceStoreTest, PromptWritesNeedTheKeyAndEndWhenTheOwnerAttends) {
  ASSERT_THAT(store_.Connect("w0", 7), IsOk());
  absl::StatusOr<AdmittedSequence> a = store_.Admit(Spec("w0", 7, "r1"));
  absl::StatusOr<AdmittedSequence> b = store_.Admit(Spec("w0", 7, "r2"));
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  EXPECT_NE(a->write_key, 0u);
  EXPECT_NE(a->write_key, b->write_key);
  std::vector<PinnedSequence> out(1);
  const std::vector<uint64_t> handles = {a->handle};
  const std::vector<int32_t> at = {5};
  // Another session (incarnation 9) writes the prompt with the key.
  EXPECT_THAT(store_.Pin({.owner_incarnation = 9, .write_key = b->write_key}, handles, at,
                         absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("wrong write key")));
  ASSERT_THAT(store_.Pin({.owner_incarnation = 9, .write_key = a->write_key}, handles, at,
                         absl::MakeSpan(out)),
              IsOk());
  store_.Unpin(handles);
  // The owner's append-only requests (migrations) leave the key valid...
  ASSERT_THAT(store_.Pin({.owner_incarnation = 7}, handles, at, absl::MakeSpan(out)), IsOk());
  store_.Unpin(handles);
  ASSERT_THAT(store_.Pin({.owner_incarnation = 9, .write_key = a->write_key}, handles, at,
                         absl::MakeSpan(out)),
              IsOk());
  store_.Unpin(handles);
  // ...its first attention ends it.
  ASSERT_THAT(store_.Pin({.owner_incarnation = 7, .attends = true}, handles,
                         std::vector<int32_t>{6}, absl::MakeSpan(out)),
              IsOk());
  store_.Unpin(handles);
  EXPECT_THAT(store_.Pin({.owner_incarnation = 9, .write_key = a->write_key}, handles, at,
                         absl::MakeSpan(out)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("has attended")));
  EXPECT_EQ(store_.Stats().held_tokens, 7);
}

TEST_F(SequenceStoreTest, ReleaseWhilePinnedFreesAtTheLastUnpin) {
  ASSERT_THAT(store_.Connect("w0", 7), IsOk());
  absl::StatusOr<AdmittedSequence> a = store_.Admit(Spec("w0", 7, "r1"));
  ASSERT_THAT(a, IsOk());
  const std::vector<uint64_t> handles = {a->handle};
  std::vector<PinnedSequence> out(1);
  ASSERT_THAT(
      store_.Pin({.owner_incarnation = 7}, handles, std::vector<int32_t>{0}, absl::MakeSpan(out)),
      IsOk());
  EXPECT_THAT(store_.Release("w0", 7, a->handle), IsOkAndHolds(kSpecBytes));
  EXPECT_EQ(pool_.used_bytes(), kSpecBytes);  // Still computing on it.
  EXPECT_EQ(store_.Stats().sequences, 0);
  EXPECT_THAT(
      store_.Pin({.owner_incarnation = 7}, handles, std::vector<int32_t>{0}, absl::MakeSpan(out)),
      StatusIs(absl::StatusCode::kNotFound));
  store_.Unpin(handles);
  EXPECT_EQ(pool_.used_bytes(), 0u);
  EXPECT_EQ(store_.Stats().held_bytes, 0);
}

TEST_F(SequenceStoreTest, IdleSequencesAreFreedButNotWhilePinned) {
  ASSERT_THAT(store_.Connect("w0", 7), IsOk());
  SequenceSpec short_idle = Spec("w0", 7, "r1");
  short_idle.idle_timeout = absl::Seconds(2);
  absl::StatusOr<AdmittedSequence> a = store_.Admit(short_idle);
  absl::StatusOr<AdmittedSequence> b = store_.Admit(Spec("w0", 7, "r2"));
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  std::vector<PinnedSequence> out(1);
  ASSERT_THAT(store_.Pin({.owner_incarnation = 7}, std::vector<uint64_t>{a->handle},
                         std::vector<int32_t>{0}, absl::MakeSpan(out)),
              IsOk());
  clock_.Advance(absl::Seconds(3));
  EXPECT_EQ(store_.Sweep(), 0);
  store_.Unpin(std::vector<uint64_t>{a->handle});
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(store_.Sweep(), 1);
  EXPECT_EQ(store_.HandlesOf("w0"), std::vector<uint64_t>{b->handle});
  clock_.Advance(absl::Seconds(60));
  EXPECT_EQ(store_.Sweep(), 1);
  EXPECT_EQ(store_.Stats().freed_idle, 2);
  EXPECT_EQ(pool_.used_bytes(), 0u);
}

}  // namespace
}  // namespace trident::attention
