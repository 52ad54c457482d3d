#include "kernels/cuda/embedding/embedding.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

struct Shape {
  int64_t num_tokens;
  int64_t vocab;
  int64_t hidden;
  // Byte offset added to the output pointer: 2 makes it 2- but not 16-byte
  // aligned, which must select the element-wise path and still be exact.
  int64_t out_offset_bytes;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << "tokens " << s.num_tokens << ", vocab " << s.vocab << ", hidden " << s.hidden
      << ", out offset " << s.out_offset_bytes << " bytes";
}

// The CPU gather the kernel must reproduce bit for bit: a copy of the table
// row, or zeros for an id outside [0, vocab).
std::vector<uint16_t> CpuGather(const std::vector<int32_t>& ids, const std::vector<uint16_t>& table,
                                int64_t vocab, int64_t hidden) {
  std::vector<uint16_t> out(ids.size() * hidden, 0);
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] < 0 || ids[t] >= vocab) continue;
    for (int64_t i = 0; i < hidden; ++i) out[t * hidden + i] = table[ids[t] * hidden + i];
  }
  return out;
}

class EmbeddingTest : public ::testing::TestWithParam<Shape> {};

TEST_P(EmbeddingTest, MatchesCpuGatherBitForBit) {
  const Shape s = GetParam();
  constexpr uint32_t kSeed = 4242;
  std::printf("seed %u, tokens %lld, vocab %lld, hidden %lld, out offset %lld\n", kSeed,
              static_cast<long long>(s.num_tokens), static_cast<long long>(s.vocab),
              static_cast<long long>(s.hidden), static_cast<long long>(s.out_offset_bytes));
  std::mt19937 rng(kSeed);
  std::vector<uint16_t> table(s.vocab * s.hidden);
  for (uint16_t& x : table) x = static_cast<uint16_t>(rng());
  std::uniform_int_distribution<int32_t> id_dist(0, static_cast<int32_t>(s.vocab - 1));
  std::vector<int32_t> ids(s.num_tokens);
  for (int32_t& id : ids) id = id_dist(rng);
  // Out-of-range ids in the middle of the batch (when it is long enough).
  const int32_t bad[] = {-1, static_cast<int32_t>(s.vocab), std::numeric_limits<int32_t>::max(),
                         std::numeric_limits<int32_t>::min()};
  for (size_t j = 0; j < 4 && 2 * j + 1 < ids.size(); ++j) ids[2 * j + 1] = bad[j];
  if (!ids.empty()) ids.back() = static_cast<int32_t>(s.vocab - 1);  // Last row of the table.
  const std::vector<uint16_t> expected = CpuGather(ids, table, s.vocab, s.hidden);

  const size_t out_bytes = static_cast<size_t>(s.num_tokens * s.hidden * 2);
  int32_t* d_ids = nullptr;
  void* d_table = nullptr;
  char* d_out = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_ids), ids.size() * 4 + 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_table, table.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_out), out_bytes + 16), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  ASSERT_EQ(
      cudaMemcpyAsync(d_table, table.data(), table.size() * 2, cudaMemcpyHostToDevice, stream),
      cudaSuccess);
  // 0xff everywhere: zero rows must be written, not left over.
  ASSERT_EQ(cudaMemsetAsync(d_out, 0xff, out_bytes + 16, stream), cudaSuccess);
  ASSERT_THAT(LaunchEmbedding({.token_ids = d_ids,
                               .num_tokens = s.num_tokens,
                               .table = d_table,
                               .vocab = s.vocab,
                               .hidden = s.hidden,
                               .out = d_out + s.out_offset_bytes},
                              stream),
              IsOk());
  std::vector<uint16_t> got(out_bytes / 2 + 8);
  ASSERT_EQ(cudaMemcpyAsync(got.data(), d_out, out_bytes + 16, cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const size_t first = static_cast<size_t>(s.out_offset_bytes / 2);
  for (size_t i = 0; i < first; ++i) ASSERT_EQ(got[i], 0xffff) << "wrote before out, " << i;
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(got[first + i], expected[i]) << "token " << i / s.hidden << " (id "
                                           << ids[i / s.hidden] << "), element " << i % s.hidden;
  }
  for (size_t i = first + expected.size(); i < got.size(); ++i) {
    ASSERT_EQ(got[i], 0xffff) << "wrote past the end of out, element " << i;
  }
  cudaStreamDestroy(stream);
  cudaFree(d_ids);
  cudaFree(d_table);
  cudaFree(d_out);
}

INSTANTIATE_TEST_SUITE_P(EdgeAndServingShapes, EmbeddingTest,
                         ::testing::Values(Shape{0, 10, 64, 0}, Shape{1, 1, 8, 0},
                                           Shape{1, 3, 7, 0}, Shape{9, 17, 7, 0},
                                           Shape{9, 100, 4096, 2}, Shape{33, 1000, 4096, 0},
                                           Shape{300, 512, 5120, 0}, Shape{257, 2048, 4104, 0}));

TEST(EmbeddingArgsTest, RejectsBadShapesAndNullPointers) {
  char dummy[16];
  const int32_t* ids = reinterpret_cast<const int32_t*>(dummy);
  const EmbeddingArgs args{
      .token_ids = ids, .num_tokens = 1, .table = dummy, .vocab = 4, .hidden = 8, .out = dummy};
  EmbeddingArgs negative = args;
  negative.num_tokens = -1;
  EXPECT_THAT(LaunchEmbedding(negative, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  EmbeddingArgs no_vocab = args;
  no_vocab.vocab = 0;
  EXPECT_THAT(LaunchEmbedding(no_vocab, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  EmbeddingArgs no_hidden = args;
  no_hidden.hidden = 0;
  EXPECT_THAT(LaunchEmbedding(no_hidden, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  EmbeddingArgs null_ids = args;
  null_ids.token_ids = nullptr;
  EXPECT_THAT(LaunchEmbedding(null_ids, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("null")));
  EmbeddingArgs null_out = args;
  null_out.out = nullptr;
  EXPECT_THAT(LaunchEmbedding(null_out, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace trident::kernels::cuda
