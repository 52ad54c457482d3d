// UcxKv's staged path on CUDA device pools (the GPU machine's UCX has no
// CUDA support, so device pools are staged there; where UCX has it, the test
// forces staging): random KV in non-contiguous blocks of one device pool
// arrives byte for byte in non-contiguous blocks of another, through
// CudaKvCopier on both sides, for both ways of copying messages in, over
// shared memory and tcp.
//
//   bazel test //common/transport/kv:ucx_kv_cuda_test   (GPU machine)

#include <cstdint>
#include <cstdio>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "common/backend/cuda/cuda_kv_copier.h"
#include "common/testing/status_matchers.h"
#include "common/transport/kv/kv_writer.h"
#include "common/transport/kv/ucx_kv.h"
#include "common/transport/kv/ucx_kv_cuda_testing.h"
#include "common/transport/kv/ucx_kv_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::transport {
namespace {

using ::trident::testing::IsOk;
using FromHost = backend::CudaKvCopierOptions::FromHost;

// Llama-3-8B's KV shape (8 KV heads, head_dim 128, bf16, blocks of 16: 64 KiB
// per block and layer), 4 layers of 96 blocks.
kv::KvCacheSpec Spec() {
  return {.num_layers = 4,
          .num_kv_heads = 8,
          .head_dim = 128,
          .block_size = 16,
          .dtype = numeric::DType::kBF16,
          .num_blocks = 96};
}

struct Param {
  std::string transports;
  FromHost from_host;
  // Staging of one slot holding one message: back-pressure on every message.
  bool one_slot;

  friend void PrintTo(const Param& p, std::ostream* os) {
    *os << p.transports << (p.from_host == FromHost::kPageable ? " pageable" : " bounce")
        << (p.one_slot ? " one slot" : "");
  }
};

class UcxKvCudaTest : public ::testing::TestWithParam<Param> {};

TEST_P(UcxKvCudaTest, StagedTransferBetweenDevicePoolsIsByteExact) {
  const Param& param = GetParam();
  const uint32_t seed = 2024 + static_cast<uint32_t>(param.from_host) + (param.one_slot ? 10 : 0);
  std::printf("seed %u\n", seed);
  backend::CudaKvCopierOptions copier_options;
  copier_options.from_host = param.from_host;
  auto sender = testing::NewCudaTestPool(Spec(), /*device=*/0, copier_options);
  auto receiver = testing::NewCudaTestPool(Spec(), /*device=*/0, copier_options);
  ASSERT_THAT(sender.status(), IsOk());
  ASSERT_THAT(receiver.status(), IsOk());
  const std::vector<uint8_t> sender_bytes = testing::RandomPoolBytes(Spec(), seed);
  const std::vector<uint8_t> receiver_before = testing::RandomPoolBytes(Spec(), seed + 1);
  (*sender)->Fill(sender_bytes);
  (*receiver)->Fill(receiver_before);

  testing::TransferSetup setup;
  setup.transports = param.transports;
  setup.spec = Spec();
  setup.num_tokens = 1000;  // 63 blocks, the last one partly filled.
  setup.local_blocks = testing::ScatteredBlocks(63, Spec().num_blocks, seed);
  setup.remote_blocks = testing::ScatteredBlocks(63, Spec().num_blocks, seed + 7);
  for (testing::Side* side : {&setup.sender, &setup.receiver}) {
    side->copier = true;
    side->force_staging = true;  // What a UCX without CUDA support does anyway.
  }
  setup.sender.pool = sender->get();
  setup.receiver.pool = receiver->get();
  const uint64_t block = Spec().block_stride_bytes();
  if (param.one_slot) {
    setup.sender.max_message_bytes = setup.sender.staging_slot_bytes = setup.sender.staging_bytes =
        block;
  } else {
    setup.sender.max_message_bytes = 5 * block;  // Runs split across messages.
    setup.sender.staging_slot_bytes = 12 * block;
    setup.sender.staging_bytes = 3 * 12 * block;
  }

  absl::StatusOr<testing::TransferResult> result = testing::RunTransfer(setup);
  if (absl::IsUnavailable(result.status())) GTEST_SKIP() << result.status();
  ASSERT_THAT(result.status(), IsOk());

  EXPECT_TRUE(result->sender_staged);
  EXPECT_TRUE(result->receiver_staged);
  EXPECT_EQ(result->destination.regions(0).rkey(), kMessagesOnlyRkey);
  EXPECT_EQ(result->destination.regions(0).memory_type(), trident::v1::MEMORY_TYPE_CUDA);
  EXPECT_EQ(result->destination.endpoint().memory_type(), trident::v1::MEMORY_TYPE_HOST);
  EXPECT_EQ(result->message_bytes, static_cast<int64_t>(Spec().num_layers * 63 * block));
  EXPECT_EQ(result->dropped_messages, 0);
  EXPECT_TRUE(testing::TransferredExactly(Spec(), sender_bytes, receiver_before,
                                          (*receiver)->Contents(), setup.local_blocks,
                                          setup.remote_blocks));
}

INSTANTIATE_TEST_SUITE_P(Staged, UcxKvCudaTest,
                         ::testing::Values(Param{"posix", FromHost::kPinnedBounce, false},
                                           Param{"posix", FromHost::kPageable, false},
                                           Param{"posix", FromHost::kPinnedBounce, true},
                                           Param{"tcp", FromHost::kPinnedBounce, false}),
                         [](const auto& info) {
                           return info.param.transports +
                                  (info.param.from_host == FromHost::kPageable ? "_pageable"
                                                                               : "_bounce") +
                                  (info.param.one_slot ? "_one_slot" : "");
                         });

}  // namespace
}  // namespace trident::transport
