#include "common/parallel/nccl_group.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <numeric>
#include <vector>

#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace trident::parallel {
namespace {

using ::trident::testing::IsOk;

std::vector<int> AllDevices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  std::vector<int> devices(count);
  std::iota(devices.begin(), devices.end(), 0);
  return devices;
}

// Rank r holds value(r, i); after the sum every rank holds the sum over
// ranks, exactly (small integers in f32 and bf16).
float Value(int rank, size_t i) { return static_cast<float>((rank + 1) * (1 + i % 7)); }

void RunSum(NcclGroup& group, numeric::DType dtype, size_t count) {
  const size_t elem = dtype == numeric::DType::kF32 ? 4 : 2;
  std::vector<void*> buffers(group.size());
  std::vector<cudaStream_t> streams(group.size());
  for (int r = 0; r < group.size(); ++r) {
    ASSERT_EQ(cudaSetDevice(group.device(r)), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&streams[r]), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&buffers[r], count * elem), cudaSuccess);
    std::vector<uint16_t> bf16(count);
    std::vector<float> f32(count);
    for (size_t i = 0; i < count; ++i) {
      f32[i] = Value(r, i);
      bf16[i] = numeric::FloatToBf16(f32[i]);
    }
    const void* host = dtype == numeric::DType::kF32 ? static_cast<const void*>(f32.data())
                                                     : static_cast<const void*>(bf16.data());
    ASSERT_EQ(cudaMemcpy(buffers[r], host, count * elem, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ASSERT_THAT(group.AllReduceSum(buffers, count, dtype, streams), IsOk());
  const int n = group.size();
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(cudaSetDevice(group.device(r)), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    std::vector<uint16_t> raw(count * elem / 2);
    ASSERT_EQ(cudaMemcpy(raw.data(), buffers[r], count * elem, cudaMemcpyDeviceToHost),
              cudaSuccess);
    int wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      const float want = static_cast<float>(n * (n + 1) / 2 * (1 + i % 7));
      const float got = dtype == numeric::DType::kF32
                            ? reinterpret_cast<const float*>(raw.data())[i]
                            : numeric::Bf16ToFloat(raw[i]);
      if (got != want) ++wrong;
    }
    EXPECT_EQ(wrong, 0) << "rank " << r << " of " << n;
    cudaFree(buffers[r]);
    cudaStreamDestroy(streams[r]);
  }
}

// Every visible GPU in one group (a single rank on a one-GPU machine: the
// sum is the identity), then each pair of the first two.
TEST(NcclGroupTest, SumsOverEveryRank) {
  const std::vector<int> devices = AllDevices();
  ASSERT_FALSE(devices.empty());
  std::printf("%zu devices\n", devices.size());
  auto group = NcclGroup::Create(devices);
  ASSERT_THAT(group.status(), IsOk());
  EXPECT_EQ((*group)->size(), static_cast<int>(devices.size()));
  for (numeric::DType dtype : {numeric::DType::kF32, numeric::DType::kBF16}) {
    for (size_t count : {size_t{1}, size_t{4096}, size_t{1} << 20}) {
      SCOPED_TRACE(::testing::Message() << numeric::DTypeName(dtype) << " x " << count);
      RunSum(**group, dtype, count);
    }
  }
  if (devices.size() >= 2) {
    auto pair = NcclGroup::Create({1, 0});  // Ranks need not follow ordinals.
    ASSERT_THAT(pair.status(), IsOk());
    EXPECT_EQ((*pair)->device(0), 1);
    RunSum(**pair, numeric::DType::kBF16, 8192);
  }
}

TEST(NcclGroupTest, RejectsBadDeviceLists) {
  const int count = static_cast<int>(AllDevices().size());
  EXPECT_EQ(NcclGroup::Create({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclGroup::Create({count}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclGroup::Create({-1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NcclGroup::Create({0, 0}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclGroupTest, RejectsBadCalls) {
  auto group = NcclGroup::Create({0});
  ASSERT_THAT(group.status(), IsOk());
  void* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 64), cudaSuccess);
  std::vector<void*> one = {buffer};
  std::vector<void*> two = {buffer, buffer};
  std::vector<cudaStream_t> streams = {nullptr};
  EXPECT_EQ((*group)->AllReduceSum(two, 4, numeric::DType::kF32, streams).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*group)->AllReduceSum(one, 4, numeric::DType::kF16, streams).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<void*> null = {nullptr};
  EXPECT_EQ((*group)->AllReduceSum(null, 4, numeric::DType::kF32, streams).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT((*group)->AllReduceSum(null, 0, numeric::DType::kF32, streams), IsOk());
  cudaFree(buffer);
}

}  // namespace
}  // namespace trident::parallel
