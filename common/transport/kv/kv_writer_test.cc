#include "common/transport/kv/kv_writer.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/kv/kv_cache.h"
#include "common/kv/kv_layout.h"
#include "common/status/error_details.h"
#include "common/testing/status_matchers.h"
#include "common/transport/ucx_worker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::transport {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr absl::Duration kDeadline = absl::Seconds(60);

kv::KvCacheSpec Spec(int32_t num_blocks) {
  return {.num_layers = 4,
          .num_kv_heads = 2,
          .head_dim = 16,
          .block_size = 4,
          .dtype = numeric::DType::kBF16,
          .num_blocks = num_blocks};
}

// A destination in a cache of `spec` at `base` (two regions: layers 0-1 and
// 2-3), for `num_tokens` tokens in `block_ids`.
trident::v1::KvDestination Destination(const kv::KvCacheSpec& spec, uint64_t base,
                                       const std::string& rkey, int32_t num_tokens,
                                       const std::vector<int32_t>& block_ids) {
  trident::v1::KvDestination destination;
  destination.set_decode_worker_id("decode-0");
  destination.set_reservation_id(1);
  destination.set_num_tokens(num_tokens);
  for (int32_t id : block_ids) destination.add_block_ids(id);
  *destination.mutable_layout() = kv::ToProto(spec);
  for (int32_t first : {0, 2}) {
    auto* region = destination.add_regions();
    region->set_base_address(base + spec.KeyOffsetBytes(first, 0));
    region->set_length_bytes(2 * spec.layer_stride_bytes());
    region->set_rkey(rkey);
    region->set_memory_type(trident::v1::MEMORY_TYPE_HOST);
    region->set_first_layer(first);
    region->set_num_layers(2);
  }
  return destination;
}

// `count` distinct block ids below `num_blocks`, in runs of 1 to 5
// consecutive ids at random places.
std::vector<int32_t> BlockIdsWithRuns(int count, int32_t num_blocks, std::mt19937& rng) {
  std::vector<int32_t> ids;
  absl::flat_hash_set<int32_t> used;
  while (static_cast<int>(ids.size()) < count) {
    const int32_t start = std::uniform_int_distribution<int32_t>(0, num_blocks - 1)(rng);
    const int length = std::min<int>(std::uniform_int_distribution<int>(1, 5)(rng),
                                     count - static_cast<int>(ids.size()));
    bool free = start + length <= num_blocks;
    for (int k = 0; free && k < length; ++k) free = !used.contains(start + k);
    if (!free) continue;
    for (int k = 0; k < length; ++k) {
      ids.push_back(start + k);
      used.insert(start + k);
    }
  }
  return ids;
}

// Runs where both id lists advance by one, counted independently of
// PlanLayerPuts.
int CountRuns(const std::vector<int32_t>& remote, const std::vector<int32_t>& local) {
  int runs = 0;
  for (size_t i = 0; i < remote.size(); ++i) {
    if (i == 0 || remote[i] != remote[i - 1] + 1 || local[i] != local[i - 1] + 1) ++runs;
  }
  return runs;
}

TEST(ValidateKvDestinationTest, AcceptsAMatchingDestination) {
  const kv::KvCacheSpec spec = Spec(32);
  EXPECT_THAT(ValidateKvDestination(spec, Destination(Spec(64), 4096, "k", 9, {5, 6, 7})), IsOk());
}

TEST(ValidateKvDestinationTest, RefusesAnotherModelsLayoutNamingTheField) {
  const kv::KvCacheSpec spec = Spec(32);
  kv::KvCacheSpec other = Spec(64);
  other.head_dim = 8;
  EXPECT_THAT(ValidateKvDestination(spec, Destination(other, 4096, "k", 9, {5, 6, 7})),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("destination.layout.head_dim is 8")));
  other = Spec(64);
  other.dtype = numeric::DType::kF16;
  EXPECT_THAT(ValidateKvDestination(spec, Destination(other, 4096, "k", 9, {5, 6, 7})),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("destination.layout.dtype is DTYPE_FLOAT16")));
  trident::v1::KvDestination token_major = Destination(Spec(64), 4096, "k", 9, {5, 6, 7});
  token_major.mutable_layout()->set_block_layout(trident::v1::KV_BLOCK_LAYOUT_TOKEN_HEAD_DIM);
  EXPECT_THAT(ValidateKvDestination(spec, token_major),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("destination.layout.block_layout")));
}

TEST(ValidateKvDestinationTest, RefusesTooFewOrTooManyBlocks) {
  const kv::KvCacheSpec spec = Spec(32);
  // 9 tokens in blocks of 4 need 3 blocks.
  for (const std::vector<int32_t>& ids : std::vector<std::vector<int32_t>>{{5, 6}, {5, 6, 7, 8}}) {
    const absl::Status status =
        ValidateKvDestination(spec, Destination(Spec(64), 4096, "k", 9, ids));
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("need 3")));
    EXPECT_THAT(GetBadRequestField(status), Optional(std::string("destination.block_ids")));
  }
  EXPECT_THAT(
      GetBadRequestField(ValidateKvDestination(spec, Destination(Spec(64), 4096, "k", 0, {}))),
      Optional(std::string("destination.num_tokens")));
}

TEST(ValidateKvDestinationTest, RefusesBlocksOutsideTheLayerOrItsRegion) {
  const kv::KvCacheSpec spec = Spec(32);
  EXPECT_THAT(GetBadRequestField(
                  ValidateKvDestination(spec, Destination(Spec(64), 4096, "k", 9, {5, 64, 7}))),
              Optional(std::string("destination.block_ids[1]")));
  EXPECT_THAT(GetBadRequestField(
                  ValidateKvDestination(spec, Destination(Spec(64), 4096, "k", 9, {5, -1, 7}))),
              Optional(std::string("destination.block_ids[1]")));
  trident::v1::KvDestination short_region = Destination(Spec(64), 4096, "k", 9, {5, 63, 7});
  short_region.mutable_regions(1)->set_length_bytes(short_region.regions(1).length_bytes() - 1);
  EXPECT_THAT(GetBadRequestField(ValidateKvDestination(spec, short_region)),
              Optional(std::string("destination.regions[1].length_bytes")));
}

TEST(ValidateKvDestinationTest, RefusesRegionsThatMissOrRepeatALayer) {
  const kv::KvCacheSpec spec = Spec(32);
  trident::v1::KvDestination missing = Destination(Spec(64), 4096, "k", 9, {5, 6, 7});
  missing.mutable_regions(1)->set_num_layers(1);
  EXPECT_THAT(ValidateKvDestination(spec, missing),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no region holds layer 3")));
  trident::v1::KvDestination overlap = Destination(Spec(64), 4096, "k", 9, {5, 6, 7});
  overlap.mutable_regions(1)->set_first_layer(1);
  overlap.mutable_regions(1)->set_num_layers(3);
  overlap.mutable_regions(1)->set_length_bytes(3 * Spec(64).layer_stride_bytes());
  EXPECT_THAT(GetBadRequestField(ValidateKvDestination(spec, overlap)),
              Optional(std::string("destination.regions[1]")));
  trident::v1::KvDestination no_rkey = Destination(Spec(64), 4096, "", 9, {5, 6, 7});
  EXPECT_THAT(GetBadRequestField(ValidateKvDestination(spec, no_rkey)),
              Optional(std::string("destination.regions[0].rkey")));
}

TEST(PlanLayerPutsTest, CollatesRunsConsecutiveOnBothSides) {
  const kv::KvCacheSpec local = Spec(32);
  const kv::KvCacheSpec remote = Spec(64);
  const uint64_t base = 1 << 20;
  const trident::v1::KvDestination destination =
      Destination(remote, base, "k", 24, {40, 41, 42, 7, 8, 9});
  const uint64_t stride = remote.block_stride_bytes();
  const int32_t layer = 3;  // Second region, second layer of it.
  const uint64_t layer_base = base + remote.KeyOffsetBytes(2, 0) + remote.layer_stride_bytes();
  EXPECT_THAT(
      PlanLayerPuts(local, destination, layer, {3, 4, 5, 9, 20, 21}),
      ElementsAre(KvPut{local.KeyOffsetBytes(layer, 3), layer_base + 40 * stride, 3 * stride, 1},
                  KvPut{local.KeyOffsetBytes(layer, 9), layer_base + 7 * stride, stride, 1},
                  KvPut{local.KeyOffsetBytes(layer, 20), layer_base + 8 * stride, 2 * stride, 1}));
  // A fresh allocation on both sides: one put per layer.
  const trident::v1::KvDestination fresh = Destination(remote, base, "k", 24, {0, 1, 2, 3, 4, 5});
  EXPECT_THAT(PlanLayerPuts(local, fresh, 0, {10, 11, 12, 13, 14, 15}),
              ElementsAre(KvPut{local.KeyOffsetBytes(0, 10), base, 6 * stride, 0}));
}

// A writer worker and a target worker, each with a host KV cache.
TEST(KvMessageHeaderTest, RoundTripsAndRefusesForeignBytes) {
  const KvMessageHeader header{.reservation_id = 0x0123456789abcdef, .remote_address = 42};
  const std::string bytes = header.Encode();
  auto decoded = KvMessageHeader::Decode(bytes);
  ASSERT_THAT(decoded, IsOk());
  EXPECT_EQ(decoded->reservation_id, header.reservation_id);
  EXPECT_EQ(decoded->remote_address, 42u);
  EXPECT_THAT(KvMessageHeader::Decode(bytes.substr(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  std::string wrong_magic = bytes;
  wrong_magic[0] ^= 1;
  EXPECT_THAT(KvMessageHeader::Decode(wrong_magic),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("magic")));
  std::string reserved = bytes;
  reserved[4] = 1;
  EXPECT_THAT(KvMessageHeader::Decode(reserved),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("reserved")));
}

TEST(CheckKvWriteRangeTest, AcceptsWholeHeldBlocksOfOneLayerOnly) {
  const kv::KvCacheSpec spec = Spec(8);
  const uint64_t block = spec.block_stride_bytes();
  const std::vector<int32_t> held = {2, 3, 6};
  EXPECT_THAT(CheckKvWriteRange(spec, spec.KeyOffsetBytes(1, 2), 2 * block, held), IsOk());
  EXPECT_THAT(CheckKvWriteRange(spec, spec.KeyOffsetBytes(0, 6), block, held), IsOk());
  EXPECT_THAT(CheckKvWriteRange(spec, spec.KeyOffsetBytes(1, 3), 2 * block, held),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block 4")));
  EXPECT_THAT(CheckKvWriteRange(spec, spec.KeyOffsetBytes(1, 2) + 1, block, held),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("whole blocks")));
  EXPECT_THAT(CheckKvWriteRange(spec, spec.KeyOffsetBytes(1, 2), block - 1, held),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(CheckKvWriteRange(spec, spec.KeyOffsetBytes(0, 6), 3 * block, held),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("leaves")));
  EXPECT_THAT(CheckKvWriteRange(spec, spec.TotalBytes(), block, held),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CheckKvWriteRangeTest, RefusesEveryWriteIntoACacheOfNoBlocks) {
  const kv::KvCacheSpec empty = Spec(0);
  ASSERT_THAT(kv::Validate(empty), IsOk());
  EXPECT_THAT(CheckKvWriteRange(empty, 0, empty.block_stride_bytes(), {0}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no blocks")));
}

TEST(WriteModeForLaneTest, MessagesWhereRmaIsEmulated) {
  for (const char* lane : {"tcp", "posix", "sysv", "self", ""}) {
    EXPECT_EQ(WriteModeForLane(lane), KvWriteMode::kMessage) << lane;
  }
  for (const char* lane : {"rc_mlx5", "dc_mlx5", "cuda_ipc", "cma"}) {
    EXPECT_EQ(WriteModeForLane(lane), KvWriteMode::kPut) << lane;
  }
}

TEST(WriteModeForTest, MessagesIntoARegionThatTakesMessagesOnly) {
  const kv::KvCacheSpec spec = Spec(8);
  trident::v1::KvDestination destination = Destination(spec, 4096, "k", 9, {5, 6, 7});
  EXPECT_EQ(WriteModeFor(destination, "rc_mlx5"), KvWriteMode::kPut);
  EXPECT_EQ(WriteModeFor(destination, "posix"), KvWriteMode::kMessage);
  destination.mutable_regions(1)->set_rkey(std::string(kMessagesOnlyRkey));
  EXPECT_EQ(WriteModeFor(destination, "rc_mlx5"), KvWriteMode::kMessage);
}

TEST(SplitKvPutsTest, SplitsIntoWholeMessagesInOrder) {
  EXPECT_EQ(KvMessageBytes(/*block_stride_bytes=*/100, /*max_message_bytes=*/250), 200u);
  EXPECT_EQ(KvMessageBytes(100, 50), 100u);
  const std::vector<KvPut> puts = {
      {.local_offset_bytes = 0, .remote_address = 1000, .length_bytes = 500, .region = 0},
      {.local_offset_bytes = 900, .remote_address = 5000, .length_bytes = 100, .region = 1}};
  EXPECT_THAT(
      SplitKvPuts(puts, 200),
      ElementsAre(
          KvPut{.local_offset_bytes = 0, .remote_address = 1000, .length_bytes = 200, .region = 0},
          KvPut{
              .local_offset_bytes = 200, .remote_address = 1200, .length_bytes = 200, .region = 0},
          KvPut{
              .local_offset_bytes = 400, .remote_address = 1400, .length_bytes = 100, .region = 0},
          KvPut{.local_offset_bytes = 900,
                .remote_address = 5000,
                .length_bytes = 100,
                .region = 1}));
}

TEST(CheckLayerBlocksTest, RefusesBadLayersAndBlocks) {
  const kv::KvCacheSpec spec = Spec(8);
  const trident::v1::KvDestination destination = Destination(Spec(16), 4096, "k", 9, {5, 6, 7});
  EXPECT_THAT(CheckLayerBlocks(spec, destination, 3, {0, 1, 7}), IsOk());
  EXPECT_THAT(CheckLayerBlocks(spec, destination, 4, {0, 1, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer 4")));
  EXPECT_THAT(CheckLayerBlocks(spec, destination, 0, {0, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 local blocks for 3")));
  EXPECT_THAT(CheckLayerBlocks(spec, destination, 0, {0, 8, 1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("local block 8 (entry 1)")));
}

class KvWriterTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto target = UcxWorker::Create({.transports = GetParam(), .name = "decode"});
    if (!target.ok()) {
      GTEST_SKIP() << "UCX transport '" << GetParam()
                   << "' is not usable here: " << target.status();
    }
    target_ = *std::move(target);
    auto writer = UcxWorker::Create({.transports = GetParam(), .name = "prefill"});
    ASSERT_THAT(writer, IsOk());
    writer_ = *std::move(writer);
    auto remote = kv::HostKvCache::Create(Spec(64));
    ASSERT_THAT(remote, IsOk());
    remote_ = *std::move(remote);
    auto local = kv::HostKvCache::Create(Spec(48));
    ASSERT_THAT(local, IsOk());
    local_ = *std::move(local);
    auto remote_region =
        target_->Register(remote_->data(), remote_->size_bytes(), MemoryKind::kHost);
    ASSERT_THAT(remote_region, IsOk());
    remote_region_ = *std::move(remote_region);
    auto local_region = writer_->Register(local_->data(), local_->size_bytes(), MemoryKind::kHost);
    ASSERT_THAT(local_region, IsOk());
    local_region_ = *std::move(local_region);
    auto endpoint = writer_->Connect(target_->address(), "decode-0");
    ASSERT_THAT(endpoint, IsOk());
    endpoint_ = *std::move(endpoint);
  }

  trident::v1::KvDestination DestinationFor(int32_t num_tokens,
                                            const std::vector<int32_t>& block_ids) {
    return Destination(remote_->spec(), reinterpret_cast<uint64_t>(remote_->data()),
                       remote_region_->packed_rkey(), num_tokens, block_ids);
  }

  std::unique_ptr<UcxWorker> target_;
  std::unique_ptr<UcxWorker> writer_;
  std::unique_ptr<kv::HostKvCache> remote_;
  std::unique_ptr<kv::HostKvCache> local_;
  std::unique_ptr<MemoryRegion> remote_region_;
  std::unique_ptr<MemoryRegion> local_region_;
  std::shared_ptr<Endpoint> endpoint_;

  void WriteEveryLayerAndCheck(KvWriteMode mode, uint64_t max_message_bytes);
};

// Writes 19 blocks (with runs to collate) of every layer in `mode`, and
// checks that exactly those blocks changed at the target.
void KvWriterTest::WriteEveryLayerAndCheck(KvWriteMode mode, uint64_t max_message_bytes) {
  const uint32_t seed = 1234;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  auto* local_bytes = static_cast<uint8_t*>(local_->data());
  for (size_t i = 0; i < local_->size_bytes(); ++i) local_bytes[i] = static_cast<uint8_t>(rng());

  const int32_t num_tokens = 75;  // 19 blocks of 4, the last one partial.
  const std::vector<int32_t> remote_ids = BlockIdsWithRuns(19, 64, rng);
  const std::vector<int32_t> local_ids = BlockIdsWithRuns(19, 48, rng);
  const int runs = CountRuns(remote_ids, local_ids);
  ASSERT_LT(runs, 19) << "the ids should contain runs to collate";
  const trident::v1::KvDestination destination = DestinationFor(num_tokens, remote_ids);
  // The receiving side of messages: what a decode worker's reservation does.
  absl::Mutex received_mu;
  int64_t received_bytes = 0;
  int messages = 0;
  auto take = [&](absl::string_view header_bytes, absl::string_view data) {
    auto header = KvMessageHeader::Decode(header_bytes);
    ASSERT_THAT(header, IsOk());
    EXPECT_EQ(header->reservation_id, destination.reservation_id());
    const uint64_t offset = header->remote_address - reinterpret_cast<uint64_t>(remote_->data());
    ASSERT_THAT(CheckKvWriteRange(remote_->spec(), offset, data.size(), remote_ids), IsOk());
    EXPECT_LE(data.size(), max_message_bytes);
    std::memcpy(static_cast<char*>(remote_->data()) + offset, data.data(), data.size());
    absl::MutexLock lock(&received_mu);
    received_bytes += data.size();
    ++messages;
  };
  // Shared-memory lanes send by rendezvous (RendezvousForLane): fetch each
  // message into a buffer of its own, then take it like an eager one.
  ASSERT_THAT(target_->SetMessageHandler(
                  kKvMessageId, take,
                  [&](absl::string_view header, std::unique_ptr<IncomingMessage> message) {
                    EXPECT_TRUE(RendezvousForLane(GetParam()));
                    auto buffer = std::make_shared<std::string>(message->length(), '\0');
                    message->Receive(buffer->data(),
                                     [&take, buffer, header = std::string(header)](absl::Status s) {
                                       ASSERT_THAT(s, IsOk());
                                       take(header, *buffer);
                                     });
                  }),
              IsOk());
  auto writer = KvWriter::Create(local_->spec(), local_->data(), endpoint_, destination, mode,
                                 max_message_bytes);
  ASSERT_THAT(writer, IsOk());
  EXPECT_EQ((*writer)->lane(), GetParam());

  // Every layer at once, last first: any order is allowed.
  absl::Mutex mu;
  std::vector<absl::Status> results;
  absl::Notification all_done;
  const int32_t num_layers = local_->spec().num_layers;
  for (int32_t layer = num_layers - 1; layer >= 0; --layer) {
    (*writer)->WriteLayer(layer, local_ids, [&](absl::Status status) {
      absl::MutexLock lock(&mu);
      results.push_back(status);
      if (static_cast<int>(results.size()) == num_layers) all_done.Notify();
    });
  }
  ASSERT_TRUE(all_done.WaitForNotificationWithTimeout(kDeadline));
  for (const absl::Status& status : results) EXPECT_THAT(status, IsOk());
  const uint64_t stride = local_->spec().block_stride_bytes();
  const int64_t total = int64_t{num_layers} * 19 * static_cast<int64_t>(stride);
  if (mode == KvWriteMode::kMessage) {
    // Sent is not received: wait for the receiver's count, as CommitKv does.
    absl::MutexLock lock(&received_mu);
    auto arrived = [&] { return received_bytes >= total; };
    ASSERT_TRUE(received_mu.AwaitWithTimeout(absl::Condition(&arrived), kDeadline));
    EXPECT_EQ(received_bytes, total);
    EXPECT_GT(messages, runs * num_layers);  // Runs longer than 2 blocks split.
  }

  absl::flat_hash_set<int32_t> written(remote_ids.begin(), remote_ids.end());
  for (int32_t layer = 0; layer < num_layers; ++layer) {
    for (size_t i = 0; i < remote_ids.size(); ++i) {
      EXPECT_EQ(std::memcmp(remote_->KeyBlock(layer, remote_ids[i]),
                            local_->KeyBlock(layer, local_ids[i]), stride),
                0)
          << "layer " << layer << " block " << i;
    }
    for (int32_t block = 0; block < remote_->spec().num_blocks; ++block) {
      if (written.contains(block)) continue;
      const auto* bytes = static_cast<const uint8_t*>(remote_->KeyBlock(layer, block));
      EXPECT_TRUE(std::all_of(bytes, bytes + stride, [](uint8_t b) { return b == 0; }))
          << "layer " << layer << " block " << block << " was not to be written";
    }
  }
  if (mode == KvWriteMode::kPut) {
    EXPECT_EQ((*writer)->messages_posted(), int64_t{runs} * num_layers);
  } else {
    EXPECT_EQ((*writer)->messages_posted(), messages);
  }
  EXPECT_EQ((*writer)->bytes_posted(), total);
  EXPECT_EQ((*writer)->bytes_completed(), (*writer)->bytes_posted());
  EXPECT_EQ((*writer)->layers_completed(), num_layers);
}

TEST_P(KvWriterTest, WritesEveryLayerOfEveryBlockExactlyWithPuts) {
  WriteEveryLayerAndCheck(KvWriteMode::kPut, 4 << 20);
}

TEST_P(KvWriterTest, WritesEveryLayerOfEveryBlockExactlyWithMessages) {
  // Two blocks a message at most: longer runs are split.
  WriteEveryLayerAndCheck(KvWriteMode::kMessage, 2 * Spec(1).block_stride_bytes() + 5);
}

TEST_P(KvWriterTest, RefusesBadLocalBlocksWithoutWriting) {
  auto writer =
      KvWriter::Create(local_->spec(), local_->data(), endpoint_, DestinationFor(9, {5, 6, 7}));
  ASSERT_THAT(writer, IsOk());
  auto write = [&](int32_t layer, std::vector<int32_t> ids) {
    absl::Notification done;
    absl::Status result;
    (*writer)->WriteLayer(layer, ids, [&](absl::Status status) {
      result = status;
      done.Notify();
    });
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(kDeadline));
    return result;
  };
  EXPECT_THAT(write(0, {1, 2}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(write(0, {1, 2, 48}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("local block 48")));
  EXPECT_THAT(write(4, {1, 2, 3}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ((*writer)->messages_posted(), 0);
}

TEST_P(KvWriterTest, CreateRefusesANonMatchingLayout) {
  kv::KvCacheSpec other = local_->spec();
  other.num_kv_heads = 4;
  EXPECT_THAT(KvWriter::Create(other, local_->data(), endpoint_, DestinationFor(9, {5, 6, 7})),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("destination.layout.num_kv_heads")));
}

TEST_P(KvWriterTest, PutModeRefusesARegionThatTakesMessagesOnly) {
  trident::v1::KvDestination destination = DestinationFor(9, {5, 6, 7});
  destination.mutable_regions(0)->set_rkey(std::string(kMessagesOnlyRkey));
  EXPECT_THAT(
      KvWriter::Create(local_->spec(), local_->data(), endpoint_, destination, KvWriteMode::kPut),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr("destination.regions[0] takes KV messages only")));
  EXPECT_THAT(KvWriter::Create(local_->spec(), local_->data(), endpoint_, destination,
                               KvWriteMode::kMessage),
              IsOk());
}

INSTANTIATE_TEST_SUITE_P(Transports, KvWriterTest, ::testing::Values("tcp", "posix"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace trident::transport
