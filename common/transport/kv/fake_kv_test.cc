// The in-process fakes of the KV data plane behave as the UCX one does where
// the code above it can tell: a transfer lands exactly in the reserved
// blocks and is counted; a message for an ended reservation is dropped by
// the receiver without failing the send; a bad destination or an absent
// peer fails Open.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "common/transport/kv/fake_kv_message_sink.h"
#include "common/transport/kv/fake_kv_receiver.h"
#include "common/transport/kv/fake_kv_sender.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::transport {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

// 2 layers, blocks of 4 tokens, 256 bytes per block and layer.
kv::KvCacheSpec Spec() {
  return {.num_layers = 2,
          .num_kv_heads = 1,
          .head_dim = 8,
          .block_size = 4,
          .dtype = numeric::DType::kF32,
          .num_blocks = 8};
}

// Bytes 1, 2, 3, ... so that every block differs.
std::vector<uint8_t> CountingPool() {
  std::vector<uint8_t> pool(Spec().TotalBytes());
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<uint8_t>(i % 251 + 1);
  return pool;
}

// A destination for reservation `id` over `blocks` of `receiver`.
trident::v1::KvDestination DestinationFor(const FakeKvReceiver& receiver, uint64_t id,
                                          int32_t num_tokens, const std::vector<int32_t>& blocks) {
  trident::v1::KvDestination d;
  EXPECT_THAT(receiver.Describe(&d), IsOk());
  d.set_reservation_id(id);
  d.set_num_tokens(num_tokens);
  for (int32_t b : blocks) d.add_block_ids(b);
  return d;
}

// Sends every layer; returns each layer's status.
std::vector<absl::Status> SendAll(KvTransfer& transfer, const std::vector<int32_t>& local) {
  std::vector<absl::Status> statuses;
  for (int32_t layer = 0; layer < Spec().num_layers; ++layer) {
    transfer.SendLayer(layer, local, [&](absl::Status s) { statuses.push_back(std::move(s)); });
  }
  return statuses;
}

// A sender's pool and a receiver ("decode-0") whose messages go to `sink`,
// the sender able to reach the receiver.
struct Plane {
  explicit Plane(uint64_t max_message_bytes = uint64_t{4} << 20)
      : local(CountingPool()),
        receiver("decode-0", 3, Spec(), &sink),
        sender(Spec(), local.data(), max_message_bytes) {
    sender.AddPeer(&receiver);
  }

  // Reserves `remote` for `num_tokens` in the sink and opens a transfer to it.
  absl::StatusOr<std::unique_ptr<KvTransfer>> Open(uint64_t id, int32_t num_tokens,
                                                   const std::vector<int32_t>& remote) {
    sink.Add(id, remote);
    return sender.Open(DestinationFor(receiver, id, num_tokens, remote));
  }

  const std::vector<uint8_t> local;
  FakeKvMessageSink sink;
  FakeKvReceiver receiver;
  FakeKvSender sender;
};

TEST(FakeKvTest, TransferLandsInTheReservedBlocksAndIsCounted) {
  Plane plane(/*max_message_bytes=*/64);
  const std::vector<int32_t> local_blocks = {0, 5};

  auto transfer = plane.Open(1, 7, {6, 2});
  ASSERT_THAT(transfer.status(), IsOk());
  EXPECT_THAT(SendAll(**transfer, local_blocks), ::testing::Each(IsOk()));

  const kv::KvCacheSpec spec = Spec();
  const uint64_t stride = spec.block_stride_bytes();
  EXPECT_EQ((*transfer)->message_bytes(), int64_t{2} * 2 * static_cast<int64_t>(stride));
  EXPECT_EQ((*transfer)->messages(), 4);  // One block per message.
  EXPECT_THAT(plane.sink.AwaitBytes(1, (*transfer)->message_bytes(), absl::Now()), IsOk());
  std::vector<uint8_t> want(spec.TotalBytes(), 0);
  for (int32_t layer = 0; layer < spec.num_layers; ++layer) {
    for (size_t i = 0; i < local_blocks.size(); ++i) {
      const int32_t remote = i == 0 ? 6 : 2;
      std::copy_n(plane.local.begin() + spec.KeyOffsetBytes(layer, local_blocks[i]), stride,
                  want.begin() + spec.KeyOffsetBytes(layer, remote));
    }
  }
  EXPECT_EQ(plane.receiver.pool(), want);
  EXPECT_EQ(plane.receiver.dropped_messages(), 0);
}

TEST(FakeKvTest, MessagesOfAnEndedReservationAreDroppedWithoutFailingTheSend) {
  Plane plane;
  auto transfer = plane.Open(1, 4, {4});
  ASSERT_THAT(transfer.status(), IsOk());
  ASSERT_TRUE(plane.sink.End(1));

  EXPECT_THAT(SendAll(**transfer, {3}), ::testing::Each(IsOk()));

  EXPECT_EQ(plane.receiver.dropped_messages(), 2);
  EXPECT_EQ(plane.sink.bytes(1), 0);
  EXPECT_EQ(plane.receiver.pool(), std::vector<uint8_t>(Spec().TotalBytes(), 0));
  EXPECT_THAT(plane.sink.AwaitBytes(1, (*transfer)->message_bytes(), absl::Now()),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(FakeKvTest, AWriteOutsideTheReservationsBlocksIsRefused) {
  FakeKvMessageSink sink;
  FakeKvReceiver receiver("decode-0", 3, Spec(), &sink);
  sink.Add(1, {4});
  trident::v1::KvDestination d = DestinationFor(receiver, 1, 4, {4});
  const uint64_t base = d.regions(0).base_address();
  const std::string block(Spec().block_stride_bytes(), 'x');

  EXPECT_THAT(receiver.Deliver(1, base + Spec().KeyOffsetBytes(0, 5), block),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(receiver.Deliver(1, base + Spec().TotalBytes(), block),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside the pool")));
  EXPECT_THAT(receiver.Deliver(1, base + Spec().KeyOffsetBytes(1, 4), block), IsOk());
  EXPECT_EQ(receiver.dropped_messages(), 2);
  EXPECT_EQ(sink.bytes(1), static_cast<int64_t>(block.size()));
}

TEST(FakeKvTest, OpenFailsForAnAbsentPeerAMismatchedLayoutAndAnInjectedError) {
  Plane plane;
  const trident::v1::KvDestination d = DestinationFor(plane.receiver, 1, 4, {4});
  trident::v1::KvDestination other_layout = d;
  other_layout.mutable_layout()->set_head_dim(16);

  EXPECT_THAT(plane.sender.Open(other_layout).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("head_dim")));
  plane.sender.FailNext(absl::UnavailableError("link down"));
  EXPECT_THAT(plane.sender.Connect(d), StatusIs(absl::StatusCode::kUnavailable, "link down"));
  EXPECT_THAT(plane.sender.Connect(d), IsOk());
  plane.sender.RemovePeer("decode-0");
  EXPECT_THAT(plane.sender.Open(d).status(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("decode-0")));
  EXPECT_EQ(plane.sender.opens(), 2);
  EXPECT_EQ(plane.sender.connects(), 2);
}

TEST(FakeKvTest, LayersSentAfterThePeerDiedFailUnavailable) {
  Plane plane;
  auto transfer = plane.Open(1, 4, {4});
  ASSERT_THAT(transfer.status(), IsOk());

  plane.sender.RemovePeer("decode-0");

  EXPECT_THAT(SendAll(**transfer, {3}), ::testing::Each(StatusIs(absl::StatusCode::kUnavailable)));
  EXPECT_EQ(plane.sink.bytes(1), 0);
}

}  // namespace
}  // namespace trident::transport
