// UcxKv between two UcxWorkers in this process, on host pools: the direct
// host path (registered pool, KvWriter) and the staged path (forced, with a
// HostKvCopier standing in for the device) write exactly the reserved
// blocks, non-contiguous on both sides. ucx_kv_cuda_test runs the staged
// path on device pools.

#include "common/transport/kv/ucx_kv.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/host_kv_copier.h"
#include "common/testing/status_matchers.h"
#include "common/transport/kv/kv_writer.h"
#include "common/transport/kv/ucx_kv_testing.h"
#include "common/transport/ucx_worker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::transport {
namespace {

using ::testing::HasSubstr;
using testing::NewHostTestPool;
using testing::RandomPoolBytes;
using testing::RunTransfer;
using testing::ScatteredBlocks;
using testing::TransferredExactly;
using testing::TransferResult;
using testing::TransferSetup;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

// Small Llama-like layers: 2 KV heads, head_dim 32, blocks of 4 tokens
// (1 KiB per block and layer).
kv::KvCacheSpec Spec() {
  return {.num_layers = 3,
          .num_kv_heads = 2,
          .head_dim = 32,
          .block_size = 4,
          .dtype = numeric::DType::kBF16,
          .num_blocks = 64};
}

struct Pools {
  explicit Pools(uint32_t seed)
      : sender(NewHostTestPool(Spec())),
        receiver(NewHostTestPool(Spec())),
        sender_bytes(RandomPoolBytes(Spec(), seed)),
        receiver_before(RandomPoolBytes(Spec(), seed + 1)) {
    std::printf("seed %u\n", seed);
    sender->Fill(sender_bytes);
    receiver->Fill(receiver_before);
  }
  std::unique_ptr<testing::TestPool> sender;
  std::unique_ptr<testing::TestPool> receiver;
  std::vector<uint8_t> sender_bytes;
  std::vector<uint8_t> receiver_before;
};

// Whether the receiver's pool now holds the sender's blocks in the reserved
// ones and its own bytes everywhere else.
bool Landed(const Pools& pools, const TransferSetup& setup) {
  return TransferredExactly(Spec(), pools.sender_bytes, pools.receiver_before,
                            pools.receiver->Contents(), setup.local_blocks, setup.remote_blocks);
}

// 150 tokens in 38 blocks, scattered differently on each side.
TransferSetup SetupFor(Pools& pools, const std::string& transports, uint32_t seed) {
  TransferSetup setup;
  setup.transports = transports;
  setup.spec = Spec();
  setup.sender.pool = pools.sender.get();
  setup.receiver.pool = pools.receiver.get();
  setup.num_tokens = 150;
  setup.local_blocks = ScatteredBlocks(38, Spec().num_blocks, seed);
  setup.remote_blocks = ScatteredBlocks(38, Spec().num_blocks, seed + 100);
  return setup;
}

class UcxKvTest : public ::testing::TestWithParam<std::string> {};

TEST_P(UcxKvTest, HostPathRegistersThePoolAndWritesExactly) {
  constexpr uint32_t kSeed = 11;
  Pools pools(kSeed);
  TransferSetup setup = SetupFor(pools, GetParam(), kSeed);

  absl::StatusOr<TransferResult> result = RunTransfer(setup);
  if (absl::IsUnavailable(result.status())) GTEST_SKIP() << result.status();
  ASSERT_THAT(result.status(), IsOk());

  EXPECT_FALSE(result->sender_staged);
  EXPECT_FALSE(result->receiver_staged);
  EXPECT_NE(result->destination.regions(0).rkey(), kMessagesOnlyRkey);
  EXPECT_EQ(result->destination.endpoint().memory_type(), trident::v1::MEMORY_TYPE_HOST);
  EXPECT_EQ(result->message_bytes, 3 * 38 * int64_t{1024});
  EXPECT_EQ(result->dropped_messages, 0);
  EXPECT_TRUE(Landed(pools, setup));
}

TEST_P(UcxKvTest, StagedBothSidesWritesExactlyThroughTheCopiers) {
  constexpr uint32_t kSeed = 12;
  Pools pools(kSeed);
  TransferSetup setup = SetupFor(pools, GetParam(), kSeed);
  setup.sender.copier = setup.receiver.copier = true;
  setup.sender.force_staging = setup.receiver.force_staging = true;
  // Messages of 3 blocks in slots of 2 messages: runs split across messages
  // and slots.
  setup.sender.max_message_bytes = 3 * 1024;
  setup.sender.staging_slot_bytes = 6 * 1024;
  setup.sender.staging_bytes = 4 * 6 * 1024;

  absl::StatusOr<TransferResult> result = RunTransfer(setup);
  if (absl::IsUnavailable(result.status())) GTEST_SKIP() << result.status();
  ASSERT_THAT(result.status(), IsOk());

  EXPECT_TRUE(result->sender_staged);
  EXPECT_TRUE(result->receiver_staged);
  EXPECT_EQ(result->destination.regions(0).rkey(), kMessagesOnlyRkey);
  EXPECT_EQ(result->message_bytes, 3 * 38 * int64_t{1024});
  EXPECT_EQ(result->bytes_sent, result->message_bytes);
  EXPECT_GE(result->messages, 3 * 38 / 3);
  EXPECT_EQ(result->dropped_messages, 0);
  EXPECT_TRUE(Landed(pools, setup));
}

TEST_P(UcxKvTest, StagedSenderWithOneSlotWaitsForItAndWritesExactly) {
  constexpr uint32_t kSeed = 13;
  Pools pools(kSeed);
  TransferSetup setup = SetupFor(pools, GetParam(), kSeed);
  setup.sender.copier = true;
  setup.sender.force_staging = true;
  // One slot of one single-block message: every message waits for the last.
  setup.sender.max_message_bytes = 1024;
  setup.sender.staging_slot_bytes = 1024;
  setup.sender.staging_bytes = 1024;

  absl::StatusOr<TransferResult> result = RunTransfer(setup);
  if (absl::IsUnavailable(result.status())) GTEST_SKIP() << result.status();
  ASSERT_THAT(result.status(), IsOk());

  EXPECT_TRUE(result->sender_staged);
  EXPECT_FALSE(result->receiver_staged);
  EXPECT_EQ(result->messages, 3 * 38);
  EXPECT_TRUE(Landed(pools, setup));
}

TEST_P(UcxKvTest, HostSenderWritesAStagedReceiverWithMessages) {
  constexpr uint32_t kSeed = 14;
  Pools pools(kSeed);
  TransferSetup setup = SetupFor(pools, GetParam(), kSeed);
  setup.receiver.copier = true;
  setup.receiver.force_staging = true;

  absl::StatusOr<TransferResult> result = RunTransfer(setup);
  if (absl::IsUnavailable(result.status())) GTEST_SKIP() << result.status();
  ASSERT_THAT(result.status(), IsOk());

  EXPECT_FALSE(result->sender_staged);
  EXPECT_TRUE(result->receiver_staged);
  EXPECT_TRUE(Landed(pools, setup));
}

// Lanes: messages spread over several UCX workers on each side, as many as
// the side with fewer has; every lane carries some.
struct LanesCase {
  int sender_lanes;
  int receiver_lanes;
  bool staged;
};

class UcxKvLanesTest : public ::testing::TestWithParam<std::tuple<std::string, LanesCase>> {};

TEST_P(UcxKvLanesTest, MessagesSpreadOverTheLanesBothSidesHaveAndLandExactly) {
  const auto& [transports, lanes] = GetParam();
  constexpr uint32_t kSeed = 15;
  Pools pools(kSeed);
  TransferSetup setup = SetupFor(pools, transports, kSeed);
  setup.sender.lanes = lanes.sender_lanes;
  setup.receiver.lanes = lanes.receiver_lanes;
  // Messages of 2 blocks: 57 of them, enough for every lane.
  setup.sender.max_message_bytes = 2 * 1024;
  if (lanes.staged) {
    setup.sender.copier = setup.receiver.copier = true;
    setup.sender.force_staging = setup.receiver.force_staging = true;
    setup.sender.staging_slot_bytes = 4 * 1024;
    setup.sender.staging_bytes = 4 * 4 * 1024;
  }

  absl::StatusOr<TransferResult> result = RunTransfer(setup);
  if (absl::IsUnavailable(result.status())) GTEST_SKIP() << result.status();
  ASSERT_THAT(result.status(), IsOk());

  EXPECT_EQ(result->destination.endpoint().lane_worker_addresses_size(), lanes.receiver_lanes - 1);
  ASSERT_EQ(result->messages_by_lane.size(), static_cast<size_t>(lanes.receiver_lanes));
  const int used = std::min(lanes.sender_lanes, lanes.receiver_lanes);
  int64_t total = 0;
  for (int lane = 0; lane < lanes.receiver_lanes; ++lane) {
    const int64_t n = result->messages_by_lane[lane];
    total += n;
    if (lane < used) {
      EXPECT_GT(n, 0) << "lane " << lane;
    } else {
      EXPECT_EQ(n, 0) << "lane " << lane;
    }
  }
  EXPECT_EQ(total, result->messages);
  EXPECT_EQ(result->dropped_messages, 0);
  EXPECT_TRUE(Landed(pools, setup));
}

INSTANTIATE_TEST_SUITE_P(
    Lanes, UcxKvLanesTest,
    ::testing::Combine(::testing::Values("posix", "tcp"),
                       ::testing::Values(LanesCase{2, 2, false}, LanesCase{3, 2, false},
                                         LanesCase{1, 3, false}, LanesCase{2, 2, true})),
    [](const auto& info) {
      const LanesCase& lanes = std::get<1>(info.param);
      return absl::StrCat(std::get<0>(info.param), "_", lanes.sender_lanes, "to",
                          lanes.receiver_lanes, lanes.staged ? "_staged" : "");
    });

// "^sysv" is the worker's default (--ucx_transports): UCX then picks the
// lane among tcp, posix and cma.
INSTANTIATE_TEST_SUITE_P(Transports, UcxKvTest, ::testing::Values("posix", "tcp", "^sysv"),
                         [](const auto& info) {
                           return info.param == "^sysv" ? std::string("worker_default")
                                                        : std::string(info.param);
                         });

class UcxKvCreateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto worker = UcxWorker::Create({.transports = "tcp", .name = "kv"});
    if (!worker.ok()) GTEST_SKIP() << worker.status();
    worker_ = *std::move(worker);
  }
  std::unique_ptr<UcxWorker> worker_;
};

TEST_F(UcxKvCreateTest, StagingWithoutACopierIsAFailedPrecondition) {
  auto pool = NewHostTestPool(Spec());
  UcxKvOptions options;
  options.force_staging = true;
  EXPECT_THAT(UcxKv::Create(worker_.get(), pool->memory(), "w", 1, std::move(options)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("KV copier")));
}

TEST_F(UcxKvCreateTest, DevicePoolWithoutCudaUcxOrCopierIsAFailedPrecondition) {
  if (worker_->supports_cuda_memory()) GTEST_SKIP() << "this UCX handles CUDA memory";
  auto pool = NewHostTestPool(Spec());
  backend::KvMemory memory = pool->memory();
  memory.device = true;  // Never touched: Create refuses first.
  EXPECT_THAT(UcxKv::Create(worker_.get(), memory, "w", 1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no CUDA support")));
}

TEST_F(UcxKvCreateTest, LanesOutsideOneToSixteenAreInvalid) {
  auto pool = NewHostTestPool(Spec());
  for (int lanes : {0, 17}) {
    UcxKvOptions options;
    options.lanes = lanes;
    EXPECT_THAT(
        UcxKv::Create(worker_.get(), pool->memory(), "w", 1, std::move(options)).status(),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(absl::StrCat("lanes is ", lanes))));
  }
}

TEST_F(UcxKvCreateTest, StagingSlotsSmallerThanAMessageAreInvalid) {
  auto pool = NewHostTestPool(Spec());
  UcxKvOptions options;
  options.force_staging = true;
  options.copier = *pool->NewCopier();
  options.staging_slot_bytes = 512;  // Half a block.
  EXPECT_THAT(UcxKv::Create(worker_.get(), pool->memory(), "w", 1, std::move(options)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("staging_slot_bytes is 512")));
  UcxKvOptions no_slot;
  no_slot.force_staging = true;
  no_slot.copier = *pool->NewCopier();
  no_slot.max_message_bytes = 4096;
  no_slot.staging_slot_bytes = 4096;
  no_slot.staging_bytes = 1000;
  EXPECT_THAT(UcxKv::Create(worker_.get(), pool->memory(), "w", 1, std::move(no_slot)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("staging_bytes is 1000")));
}

TEST_F(UcxKvCreateTest, StagedSendLayerRefusesBadBlocksWithoutSending) {
  auto pool = NewHostTestPool(Spec());
  UcxKvOptions options;
  options.force_staging = true;
  options.copier = *pool->NewCopier();
  auto kv = UcxKv::Create(worker_.get(), pool->memory(), "w", 1, std::move(options));
  ASSERT_THAT(kv.status(), IsOk());
  trident::v1::KvDestination d;
  ASSERT_THAT((*kv)->Describe(&d), IsOk());
  d.set_reservation_id(1);
  d.set_num_tokens(8);
  d.add_block_ids(3);
  d.add_block_ids(4);
  auto transfer = (*kv)->Open(d);  // To itself.
  ASSERT_THAT(transfer.status(), IsOk());
  absl::Status got = absl::UnknownError("not called");
  const std::vector<int32_t> outside = {1, 64};
  (*transfer)->SendLayer(0, outside, [&](absl::Status s) { got = std::move(s); });
  EXPECT_THAT(got, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("local block 64")));
  const std::vector<int32_t> fine = {1, 2};
  (*transfer)->SendLayer(3, fine, [&](absl::Status s) { got = std::move(s); });
  EXPECT_THAT(got, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer 3")));
  EXPECT_EQ((*transfer)->messages(), 0);
}

}  // namespace
}  // namespace trident::transport
