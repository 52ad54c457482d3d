#include "kernels/cuda/block_copy/block_copy.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::testing::IsOk;

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

// Copies `blocks` blocks of `block_bytes` from a pool on src_device to
// shuffled slots of a pool (twice as many slots) on dst_device, launched on
// launch_device, and checks every slot: copied blocks equal their source
// (the memcpy reference), the others keep their fill.
void CheckCopy(int src_device, int dst_device, int launch_device, int64_t blocks,
               int64_t block_bytes) {
  const uint32_t seed = 20261128;
  std::printf("src %d dst %d launch %d: %lld blocks of %lld bytes, seed %u\n", src_device,
              dst_device, launch_device, static_cast<long long>(blocks),
              static_cast<long long>(block_bytes), seed);
  std::mt19937 rng(seed);
  std::vector<uint8_t> source(blocks * block_bytes);
  for (auto& b : source) b = static_cast<uint8_t>(rng());
  const int64_t slots = 2 * blocks;
  std::vector<int64_t> order(slots);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);

  void* src = nullptr;
  void* dst = nullptr;
  ASSERT_EQ(cudaSetDevice(src_device), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&src, source.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(src, source.data(), source.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(dst_device), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, slots * block_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(dst, 0xa5, slots * block_bytes), cudaSuccess);

  std::vector<const void*> from(blocks);
  std::vector<void*> to(blocks);
  for (int64_t i = 0; i < blocks; ++i) {
    from[i] = static_cast<const char*>(src) + i * block_bytes;
    to[i] = static_cast<char*>(dst) + order[i] * block_bytes;
  }
  ASSERT_EQ(cudaSetDevice(launch_device), cudaSuccess);
  void* tables = nullptr;
  ASSERT_EQ(cudaMalloc(&tables, 2 * blocks * sizeof(void*)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(tables, from.data(), blocks * sizeof(void*), cudaMemcpyHostToDevice),
            cudaSuccess);
  void** dst_table = static_cast<void**>(tables) + blocks;
  ASSERT_EQ(cudaMemcpy(dst_table, to.data(), blocks * sizeof(void*), cudaMemcpyHostToDevice),
            cudaSuccess);
  const BlockCopyArgs args{.src = static_cast<const void* const*>(tables),
                           .dst = dst_table,
                           .num_blocks = blocks,
                           .block_bytes = block_bytes};
  ASSERT_THAT(LaunchBlockCopy(args, nullptr), IsOk());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<uint8_t> got(slots * block_bytes);
  ASSERT_EQ(cudaSetDevice(dst_device), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got.data(), dst, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<int64_t> source_of(slots, -1);
  for (int64_t i = 0; i < blocks; ++i) source_of[order[i]] = i;
  std::vector<uint8_t> fill(block_bytes, 0xa5);
  int64_t wrong = 0;
  for (int64_t s = 0; s < slots; ++s) {
    const uint8_t* want =
        source_of[s] < 0 ? fill.data() : source.data() + source_of[s] * block_bytes;
    if (std::memcmp(got.data() + s * block_bytes, want, block_bytes) != 0) ++wrong;
  }
  EXPECT_EQ(wrong, 0) << "of " << slots << " slots";
  cudaFree(tables);
  cudaFree(src);
  cudaFree(dst);
}

TEST(BlockCopyTest, CopiesScatteredBlocksOnOneDevice) {
  for (int64_t block_bytes : {16, 4112, 65536, 262160}) CheckCopy(0, 0, 0, 37, block_bytes);
  CheckCopy(0, 0, 0, 2048, 65536);
}

// Between two GPUs with peer access: pulled (launched where the blocks go)
// and pushed (launched where they come from).
TEST(BlockCopyTest, CopiesBetweenPeers) {
  int can = 0;
  if (DeviceCount() < 2 || cudaDeviceCanAccessPeer(&can, 0, 1) != cudaSuccess || !can) {
    GTEST_SKIP() << "needs two GPUs with peer access";
  }
  for (int d : {0, 1}) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    const cudaError_t e = cudaDeviceEnablePeerAccess(1 - d, 0);
    ASSERT_TRUE(e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled) << e;
    cudaGetLastError();
  }
  CheckCopy(1, 0, 0, 513, 65536);
  CheckCopy(1, 0, 1, 513, 65536);
  CheckCopy(0, 1, 0, 100, 4112);
}

TEST(BlockCopyTest, RejectsBadArgs) {
  BlockCopyArgs args;
  args.num_blocks = 1;
  args.block_bytes = 24;
  EXPECT_EQ(LaunchBlockCopy(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.block_bytes = 0;
  EXPECT_EQ(LaunchBlockCopy(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.block_bytes = 32;
  EXPECT_EQ(LaunchBlockCopy(args, nullptr).code(), absl::StatusCode::kInvalidArgument);  // nulls
  args.num_blocks = -1;
  EXPECT_EQ(LaunchBlockCopy(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.num_blocks = 0;
  EXPECT_THAT(LaunchBlockCopy(args, nullptr), IsOk());
}

}  // namespace
}  // namespace trident::kernels::cuda
