// CudaKvCopier against a host copy of a device pool: bytes land where the
// ranges say, for both ways of copying from host, with ranges that are
// adjacent (coalesced), out of order, and larger than the bounce buffers.

#include "common/backend/cuda/cuda_kv_copier.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::backend {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr uint64_t kPoolBytes = 3 << 20;

class DevicePool {
 public:
  DevicePool() {
    if (cudaMalloc(&base_, kPoolBytes) != cudaSuccess) base_ = nullptr;
  }
  ~DevicePool() {
    if (base_ != nullptr) cudaFree(base_);
  }
  KvMemory memory() const {
    KvMemory m;
    m.base = base_;
    m.bytes = kPoolBytes;
    m.device = true;
    m.device_ordinal = 0;
    return m;
  }
  void Write(const std::vector<uint8_t>& bytes) {
    ASSERT_EQ(cudaMemcpy(base_, bytes.data(), kPoolBytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<uint8_t> Read() const {
    std::vector<uint8_t> out(kPoolBytes);
    EXPECT_EQ(cudaMemcpy(out.data(), base_, kPoolBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  void* base_ = nullptr;
};

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

// Out of order, two adjacent (coalesced into one copy), one larger than
// several bounce buffers, odd sizes.
const std::vector<KvRange>& TestRanges() {
  static const auto* ranges = new std::vector<KvRange>{
      {.offset_bytes = 2 << 20, .length_bytes = 65536},
      {.offset_bytes = (2 << 20) + 65536, .length_bytes = 4097},
      {.offset_bytes = 1, .length_bytes = 1},
      {.offset_bytes = 100000, .length_bytes = (1 << 20) + 12345},
      {.offset_bytes = kPoolBytes - 7, .length_bytes = 7},
  };
  return *ranges;
}

TEST(CudaKvCopierTest, CopiesRangesToHostBackToBack) {
  constexpr uint32_t kSeed = 20240611;
  std::printf("seed %u\n", kSeed);
  DevicePool pool;
  const std::vector<uint8_t> bytes = RandomBytes(kPoolBytes, kSeed);
  pool.Write(bytes);
  auto copier = CudaKvCopier::Create(pool.memory());
  ASSERT_THAT(copier.status(), IsOk());
  auto staging = (*copier)->AllocateHost(TotalBytes(TestRanges()));
  ASSERT_THAT(staging.status(), IsOk());

  ASSERT_THAT((*copier)->CopyToHost(TestRanges(), (*staging)->data()), IsOk());

  std::vector<uint8_t> want;
  for (const KvRange& r : TestRanges()) {
    want.insert(want.end(), bytes.begin() + r.offset_bytes,
                bytes.begin() + r.offset_bytes + r.length_bytes);
  }
  EXPECT_TRUE(
      std::equal(want.begin(), want.end(), reinterpret_cast<const uint8_t*>((*staging)->data())));
}

class CudaKvCopierFromHostTest : public ::testing::TestWithParam<CudaKvCopierOptions::FromHost> {};

TEST_P(CudaKvCopierFromHostTest, WritesOnlyTheRangesFromPageableMemory) {
  constexpr uint32_t kSeed = 7;
  std::printf("seed %u\n", kSeed);
  DevicePool pool;
  const std::vector<uint8_t> before = RandomBytes(kPoolBytes, kSeed);
  pool.Write(before);
  CudaKvCopierOptions options;
  options.from_host = GetParam();
  options.bounce_buffer_bytes = 100000;  // Not a divisor of any range.
  options.bounce_buffers = 3;
  auto copier = CudaKvCopier::Create(pool.memory(), options);
  ASSERT_THAT(copier.status(), IsOk());
  // Plain (pageable) memory, as a UCX receive buffer is.
  const std::vector<uint8_t> src = RandomBytes(TotalBytes(TestRanges()), kSeed + 1);

  // Twice: the second call reuses the bounce buffers from their start.
  for (int round = 0; round < 2; ++round) {
    ASSERT_THAT((*copier)->CopyFromHost(src.data(), TestRanges()), IsOk());
  }

  std::vector<uint8_t> want = before;
  size_t at = 0;
  for (const KvRange& r : TestRanges()) {
    std::copy(src.begin() + at, src.begin() + at + r.length_bytes, want.begin() + r.offset_bytes);
    at += r.length_bytes;
  }
  const std::vector<uint8_t> got = pool.Read();
  ASSERT_EQ(got.size(), want.size());
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && mismatches++ == 0) first = i;
  }
  EXPECT_EQ(mismatches, 0u) << "first mismatch at byte " << first;
}

INSTANTIATE_TEST_SUITE_P(BothModes, CudaKvCopierFromHostTest,
                         ::testing::Values(CudaKvCopierOptions::FromHost::kPinnedBounce,
                                           CudaKvCopierOptions::FromHost::kPageable));

TEST(CudaKvCopierTest, RejectsRangesOutsideThePool) {
  DevicePool pool;
  auto copier = CudaKvCopier::Create(pool.memory());
  ASSERT_THAT(copier.status(), IsOk());
  std::vector<uint8_t> host(16);
  const std::vector<KvRange> outside = {{.offset_bytes = 0, .length_bytes = 8},
                                        {.offset_bytes = kPoolBytes - 4, .length_bytes = 8}};
  EXPECT_THAT((*copier)->CopyToHost(outside, host.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ranges[1]")));
  EXPECT_THAT((*copier)->CopyFromHost(host.data(), outside),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ranges[1]")));
}

TEST(CudaKvCopierTest, RefusesHostMemoryAndMissingDevices) {
  std::vector<uint8_t> host(64);
  KvMemory memory;
  memory.base = host.data();
  memory.bytes = host.size();
  EXPECT_THAT(CudaKvCopier::Create(memory).status(), StatusIs(absl::StatusCode::kInvalidArgument));
  DevicePool pool;
  KvMemory far = pool.memory();
  far.device_ordinal = 1 << 20;
  EXPECT_THAT(CudaKvCopier::Create(far).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace trident::backend
