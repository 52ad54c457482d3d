#include "kernels/cuda/random_fill/random_fill.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/numeric/counter_stream.h"
#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

bool HasDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

numeric::CounterStreamBlock Block(int64_t tensor_cols, int64_t row0, int64_t col0, int64_t rows,
                                  int64_t cols) {
  numeric::CounterStreamBlock b;
  b.base = numeric::SplitMix64(20261129);
  b.mean = 0.0f;
  b.half_width = 0.05f * 1.7320508f;
  b.tensor_cols = tensor_cols;
  b.row0 = row0;
  b.col0 = col0;
  b.rows = rows;
  b.cols = cols;
  return b;
}

// Fills the block on the device `offset` elements into a buffer and checks
// every element against the host reference, and that the elements around
// the block keep their fill.
void CheckFill(const numeric::CounterStreamBlock& block, int64_t offset) {
  std::printf("block %lld x %lld at (%lld, %lld) of %lld columns, offset %lld, base %llu\n",
              static_cast<long long>(block.rows), static_cast<long long>(block.cols),
              static_cast<long long>(block.row0), static_cast<long long>(block.col0),
              static_cast<long long>(block.tensor_cols), static_cast<long long>(offset),
              static_cast<unsigned long long>(block.base));
  const int64_t total = block.rows * block.cols;
  const size_t length = static_cast<size_t>(total + offset + 16);
  uint16_t* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&buffer), length * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(buffer, 0xab, length * 2), cudaSuccess);
  uint8_t* flags = nullptr;
  if (!block.quarter_rows.empty()) {
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&flags), block.quarter_rows.size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(flags, block.quarter_rows.data(), block.quarter_rows.size(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ASSERT_THAT(LaunchRandomFillBf16({&block, flags, buffer + offset}, nullptr), IsOk());
  std::vector<uint16_t> got(length);
  ASSERT_EQ(cudaMemcpy(got.data(), buffer, length * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(buffer);
  cudaFree(flags);
  for (int64_t i = 0; i < offset; ++i) ASSERT_EQ(got[i], 0xabab) << "before, at " << i;
  for (int64_t r = 0; r < block.rows; ++r) {
    for (int64_t c = 0; c < block.cols; ++c) {
      ASSERT_EQ(got[offset + r * block.cols + c],
                numeric::FloatToBf16(numeric::BlockElement(block, r, c)))
          << "element (" << r << ", " << c << ")";
    }
  }
  for (size_t i = static_cast<size_t>(offset + total); i < length; ++i) {
    ASSERT_EQ(got[i], 0xabab) << "after, at " << i;
  }
}

TEST(RandomFillTest, RowsOfATensorEqualTheHostStream) {
  if (!HasDevice()) GTEST_SKIP() << "no CUDA device";
  CheckFill(Block(4096, 0, 0, 64, 4096), 0);
  CheckFill(Block(4096, 1000, 0, 24, 4096), 0);
}

TEST(RandomFillTest, AColumnSliceSkipsTheOtherColumns) {
  if (!HasDevice()) GTEST_SKIP() << "no CUDA device";
  CheckFill(Block(4096, 0, 1024, 33, 1024), 0);
  CheckFill(Block(999, 0, 1, 17, 997), 0);
}

TEST(RandomFillTest, RaggedSizesAndUnalignedOutputs) {
  if (!HasDevice()) GTEST_SKIP() << "no CUDA device";
  CheckFill(Block(999, 5, 0, 37, 999), 0);  // 36963 elements: a ragged last group.
  CheckFill(Block(4096, 0, 0, 16, 4096), 1);
  CheckFill(Block(4096, 0, 0, 16, 4096), 3);
  CheckFill(Block(1, 0, 0, 3, 1), 0);  // A 1-D tensor of 3.
}

TEST(RandomFillTest, FlaggedRowsAreScaledByAQuarter) {
  if (!HasDevice()) GTEST_SKIP() << "no CUDA device";
  numeric::CounterStreamBlock block = Block(256, 10, 0, 100, 256);
  block.quarter_rows.resize(100);
  for (size_t r = 0; r < block.quarter_rows.size(); ++r) block.quarter_rows[r] = r % 3 == 0;
  CheckFill(block, 0);
}

TEST(RandomFillTest, ALargeBlockLoopsOverTheGrid) {
  if (!HasDevice()) GTEST_SKIP() << "no CUDA device";
  // 64M elements: more groups than the grid's 4096 CTAs of 256 threads.
  CheckFill(Block(8192, 0, 0, 8192, 8192), 0);
}

TEST(RandomFillTest, BadArgumentsAreRefused) {
  numeric::CounterStreamBlock block = Block(64, 0, 0, 4, 64);
  uint16_t* out = reinterpret_cast<uint16_t*>(16);  // Never written: every call is refused.
  EXPECT_THAT(LaunchRandomFillBf16({nullptr, nullptr, out}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(LaunchRandomFillBf16({&block, nullptr, nullptr}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  numeric::CounterStreamBlock outside = Block(64, 0, 32, 4, 64);
  EXPECT_THAT(LaunchRandomFillBf16({&outside, nullptr, out}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  numeric::CounterStreamBlock negative = Block(64, -1, 0, 4, 64);
  EXPECT_THAT(LaunchRandomFillBf16({&negative, nullptr, out}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  numeric::CounterStreamBlock flagged = block;
  flagged.quarter_rows.assign(4, 1);
  EXPECT_THAT(LaunchRandomFillBf16({&flagged, nullptr, out}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  flagged.quarter_rows.assign(3, 1);
  EXPECT_THAT(LaunchRandomFillBf16({&flagged, reinterpret_cast<const uint8_t*>(16), out}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  numeric::CounterStreamBlock empty = Block(64, 0, 0, 0, 64);
  EXPECT_THAT(LaunchRandomFillBf16({&empty, nullptr, nullptr}, nullptr), IsOk());
}

}  // namespace
}  // namespace trident::kernels::cuda
