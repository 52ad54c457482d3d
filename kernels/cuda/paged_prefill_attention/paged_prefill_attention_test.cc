#include "kernels/cuda/paged_prefill_attention/paged_prefill_attention.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/paged_attention/paged_attention.h"
#include "kernels/cuda/arch/arch.h"

namespace trident::kernels::cuda {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr uint32_t kSeed = 4242;
// bf16 q, K and V are exact in both; the kernel rounds P to bf16 before P.V
// (relative 2^-9 per weight) and rounds the output to bf16 (2^-9 of |out|,
// outputs are convex combinations of N(0, 1) values, so |out| < ~4).
constexpr float kAbsTolerance = 2e-2f;
constexpr float kRelTolerance = 1e-2f;
constexpr uint16_t kBf16Sentinel = 0x7fc1;  // A NaN the kernel never produces.

struct SeqShape {
  int32_t context_len;
  int32_t query_len;
};

struct Config {
  int32_t head_dim;
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t block_size = 16;
};

struct Case {
  std::string name;
  std::vector<SeqShape> seqs;
  float q_scale = 1.0f;
};

template <typename T>
T* DeviceCopy(const std::vector<T>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(host.size() * sizeof(T), 16)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return static_cast<T*>(p);
}

// A bf16 paged cache with padding between K, V and blocks, unwritten slots
// holding NaN (any read of one poisons the output), sequences on shuffled
// blocks, q rows as wide as a fused qkv row, out rows wider than the heads,
// and an unused row between consecutive sequences' query rows.
class Batch {
 public:
  Batch(const Config& c, const std::vector<SeqShape>& shapes, float q_scale, uint32_t seed)
      : config_(c), rng_(seed) {
    const int64_t half = static_cast<int64_t>(c.num_kv_heads) * c.block_size * c.head_dim;
    kv_.dtype = numeric::DType::kBF16;
    kv_.block_size = c.block_size;
    kv_.num_kv_heads = c.num_kv_heads;
    kv_.head_dim = c.head_dim;
    kv_.value_offset_elems = half + 8;
    kv_.block_stride_elems = 2 * half + 24;
    int32_t num_blocks = 3;  // Spare blocks that no sequence uses.
    max_blocks_per_seq_ = 1;
    for (const SeqShape& s : shapes) {
      const int32_t blocks = (s.context_len + c.block_size - 1) / c.block_size;
      num_blocks += blocks;
      max_blocks_per_seq_ = std::max(max_blocks_per_seq_, blocks + 1);  // One spare column.
    }
    cache_.assign(static_cast<size_t>(num_blocks) * kv_.block_stride_elems,
                  numeric::FloatToBf16(NAN));
    kv_.base = cache_.data();
    std::vector<int32_t> physical(num_blocks);
    std::iota(physical.begin(), physical.end(), 0);
    std::shuffle(physical.begin(), physical.end(), rng_);

    const int32_t kv_row = c.num_kv_heads * c.head_dim;
    q_stride_ = static_cast<int64_t>(c.num_q_heads + 2 * c.num_kv_heads) * c.head_dim;
    out_stride_ = static_cast<int64_t>(c.num_q_heads) * c.head_dim + 16;
    std::normal_distribution<float> unit(0.0f, 1.0f);
    tables_.assign(shapes.size() * max_blocks_per_seq_, -1);  // -1 past the context.
    int64_t next_row = 0;
    int32_t next_block = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const SeqShape& s = shapes[i];
      int32_t* table = &tables_[i * max_blocks_per_seq_];
      for (int32_t b = 0; b < (s.context_len + c.block_size - 1) / c.block_size; ++b) {
        table[b] = physical[next_block++];
      }
      // Values already rounded to bf16, so the CPU reference sees exactly what
      // the GPU reads.
      std::vector<float> k(static_cast<size_t>(s.context_len) * kv_row);
      std::vector<float> v(k.size());
      for (float& x : k) x = numeric::Bf16ToFloat(numeric::FloatToBf16(unit(rng_)));
      for (float& x : v) x = numeric::Bf16ToFloat(numeric::FloatToBf16(unit(rng_)));
      std::vector<int64_t> slots(s.context_len);
      for (int32_t p = 0; p < s.context_len; ++p) {
        slots[p] = static_cast<int64_t>(table[p / c.block_size]) * c.block_size + p % c.block_size;
      }
      cpu::AppendKv(kv_, k.data(), kv_row, v.data(), kv_row, slots.data(), s.context_len);
      context_lens_.push_back(s.context_len);
      query_lens_.push_back(s.query_len);
      query_starts_.push_back(static_cast<int32_t>(next_row));
      max_query_len_ = std::max(max_query_len_, s.query_len);
      if (s.query_len > 0) {
        seqs_.push_back(cpu::AttentionSequence{table, s.context_len, s.query_len, next_row});
      }
      next_row += s.query_len + 1;  // One row no sequence owns.
    }
    num_rows_ = next_row;
    q_bf16_.resize(num_rows_ * q_stride_);
    q_float_.resize(q_bf16_.size());
    for (size_t i = 0; i < q_bf16_.size(); ++i) {
      q_bf16_[i] = numeric::FloatToBf16(unit(rng_) * q_scale);
      q_float_[i] = numeric::Bf16ToFloat(q_bf16_[i]);
    }
  }

  // Runs the GPU kernel and the CPU PagedAttention on the same bf16 data;
  // expects agreement, and untouched columns past the heads and rows no
  // sequence owns.
  void ExpectMatchesCpu(PrefillKernel kernel) {
    const Config& c = config_;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    std::vector<float> want(num_rows_ * out_stride_, NAN);
    cpu::PagedAttention(kv_, q_float_.data(), q_stride_, c.num_q_heads, seqs_, scale, want.data(),
                        out_stride_);

    std::vector<uint16_t> out_init(num_rows_ * out_stride_, kBf16Sentinel);
    uint16_t* d_cache = DeviceCopy(cache_);
    uint16_t* d_q = DeviceCopy(q_bf16_);
    uint16_t* d_out = DeviceCopy(out_init);
    int32_t* d_tables = DeviceCopy(tables_);
    int32_t* d_context = DeviceCopy(context_lens_);
    int32_t* d_query = DeviceCopy(query_lens_);
    int32_t* d_starts = DeviceCopy(query_starts_);
    const PagedPrefillArgs args{.q = d_q,
                                .q_stride = q_stride_,
                                .out = d_out,
                                .out_stride = out_stride_,
                                .kv_base = d_cache,
                                .block_stride_elems = kv_.block_stride_elems,
                                .value_offset_elems = kv_.value_offset_elems,
                                .block_size = c.block_size,
                                .num_q_heads = c.num_q_heads,
                                .num_kv_heads = c.num_kv_heads,
                                .head_dim = c.head_dim,
                                .block_tables = d_tables,
                                .max_blocks_per_seq = max_blocks_per_seq_,
                                .context_lens = d_context,
                                .query_lens = d_query,
                                .query_starts = d_starts,
                                .batch = static_cast<int32_t>(context_lens_.size()),
                                .max_query_len = max_query_len_,
                                .scale = scale,
                                .kernel = kernel};
    EXPECT_THAT(LaunchPagedPrefillAttention(args, nullptr), IsOk());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> got(out_init.size());
    EXPECT_EQ(cudaMemcpy(got.data(), d_out, got.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (void* p :
         std::vector<void*>{d_cache, d_q, d_out, d_tables, d_context, d_query, d_starts}) {
      cudaFree(p);
    }

    std::vector<bool> owned(num_rows_, false);
    for (const cpu::AttentionSequence& s : seqs_) {
      for (int32_t j = 0; j < s.query_len; ++j) owned[s.query_row + j] = true;
    }
    const int64_t width = static_cast<int64_t>(c.num_q_heads) * c.head_dim;
    float max_error = 0.0f;
    int64_t failures = 0;
    for (int64_t r = 0; r < num_rows_; ++r) {
      for (int64_t i = 0; i < out_stride_; ++i) {
        const uint16_t bits = got[r * out_stride_ + i];
        if (!owned[r] || i >= width) {
          if (bits != kBf16Sentinel && ++failures <= 10) {
            ADD_FAILURE() << "row " << r << " column " << i
                          << " is outside every query's heads but was written";
          }
          continue;
        }
        const float value = numeric::Bf16ToFloat(bits);
        const float expected = want[r * out_stride_ + i];
        const float error = std::abs(value - expected);
        if (!(error <= kAbsTolerance + kRelTolerance * std::abs(expected))) {
          if (++failures <= 10) {
            ADD_FAILURE() << "row " << r << " head " << i / c.head_dim << " dim " << i % c.head_dim
                          << ": got " << value << ", want " << expected;
          }
        }
        if (std::isnan(error)) max_error = INFINITY;
        max_error = std::max(max_error, error);
      }
    }
    EXPECT_EQ(failures, 0) << "max error " << max_error;
    std::printf("max abs error %g over %lld rows\n", max_error, static_cast<long long>(num_rows_));
  }

 private:
  Config config_;
  std::mt19937 rng_;
  cpu::PagedKv kv_;
  std::vector<uint16_t> cache_;
  std::vector<int32_t> tables_;
  int32_t max_blocks_per_seq_ = 0;
  std::vector<int32_t> context_lens_;
  std::vector<int32_t> query_lens_;
  std::vector<int32_t> query_starts_;
  int32_t max_query_len_ = 0;
  std::vector<cpu::AttentionSequence> seqs_;
  std::vector<uint16_t> q_bf16_;
  std::vector<float> q_float_;
  int64_t q_stride_ = 0;
  int64_t out_stride_ = 0;
  int64_t num_rows_ = 0;
};

std::vector<Case> Cases() {
  return {
      // Whole prefills (context == query): 1, under a tile, exactly a 64-row
      // tile, over one, and over four 128-row tiles.
      {"Prefill1", {{1, 1}}},
      {"Prefill15", {{15, 15}}},
      {"Prefill64", {{64, 64}}},
      {"Prefill100", {{100, 100}}},
      {"Prefill513", {{513, 513}}},
      // Chunks: the query is the last query_len positions of a longer context.
      {"Chunk1", {{300, 1}}},
      {"Chunk15", {{80, 15}}},
      {"Chunk64", {{200, 64}}},
      {"Chunk100", {{1000, 100}}},
      {"Chunk513", {{700, 513}}},
      // Different lengths in one batch, a sequence with no query tokens
      // (skipped), and a context that ends mid-block.
      {"MixedBatch",
       {{513, 513}, {1, 1}, {130, 64}, {50, 0}, {17, 15}, {1000, 100}, {64, 64}, {257, 129}}},
      // Scores spread over tens of units: the running max moves between tiles.
      {"PeakedScores", {{400, 200}, {90, 90}}, 6.0f},
  };
}

std::string ConfigName(const Config& c) {
  return "Dim" + std::to_string(c.head_dim) + "Q" + std::to_string(c.num_q_heads) + "Kv" +
         std::to_string(c.num_kv_heads) + "Block" + std::to_string(c.block_size);
}

class PagedPrefillAttentionTest : public ::testing::TestWithParam<std::tuple<Config, Case>> {};

TEST_P(PagedPrefillAttentionTest, MatchesCpuPagedAttention) {
  const auto& [config, test_case] = GetParam();
  std::printf("seed %u, %s, %s\n", kSeed, ConfigName(config).c_str(), test_case.name.c_str());
  Batch batch(config, test_case.seqs, test_case.q_scale, kSeed);
  batch.ExpectMatchesCpu(PrefillKernel::kMmaSync);
  // Hopper's wgmma kernel on the same data, where it applies.
  if (config.head_dim == 128 && CurrentDeviceIsSm90()) {
    std::printf("wgmma kernel: ");
    batch.ExpectMatchesCpu(PrefillKernel::kWgmma);
  }
}

INSTANTIATE_TEST_SUITE_P(
    HeadDimsGqaAndLengths, PagedPrefillAttentionTest,
    ::testing::Combine(::testing::Values(Config{64, 4, 4}, Config{128, 2, 2}, Config{128, 8, 2},
                                         Config{64, 16, 2}, Config{128, 16, 2},
                                         // Gathers that do not line up with 64-token tiles.
                                         Config{128, 8, 2, 32}, Config{64, 4, 1, 7},
                                         // Head dims below the tiles' width, masked.
                                         Config{16, 4, 2}, Config{32, 8, 2, 7}, Config{48, 4, 4},
                                         Config{80, 8, 2}, Config{96, 16, 2, 32}, Config{112, 2, 2},
                                         Config{256, 8, 2}, Config{192, 4, 4, 7},
                                         Config{144, 8, 1}),
                       ::testing::ValuesIn(Cases())),
    [](const ::testing::TestParamInfo<std::tuple<Config, Case>>& info) {
      return ConfigName(std::get<0>(info.param)) + std::get<1>(info.param).name;
    });

PagedPrefillArgs ValidArgs() {
  alignas(16) static char buffer[64];
  static const int32_t ints[4] = {};
  return PagedPrefillArgs{.q = buffer,
                          .q_stride = 4 * 128,
                          .out = buffer,
                          .out_stride = 4 * 128,
                          .kv_base = buffer,
                          .block_stride_elems = 2 * 2 * 16 * 128,
                          .value_offset_elems = 2 * 16 * 128,
                          .block_size = 16,
                          .num_q_heads = 4,
                          .num_kv_heads = 2,
                          .head_dim = 128,
                          .block_tables = ints,
                          .max_blocks_per_seq = 1,
                          .context_lens = ints,
                          .query_lens = ints,
                          .query_starts = ints,
                          .batch = 1,
                          .max_query_len = 1,
                          .scale = 0.1f};
}

// Each mutation below must be rejected before any launch (the stream is
// null and the pointers are host memory).
TEST(PagedPrefillAttentionArgsTest, RejectsBadArgumentsNamingTheField) {
  struct Bad {
    std::string field;
    void (*mutate)(PagedPrefillArgs&);
  };
  const std::vector<Bad> bad = {
      {"head_dim", [](PagedPrefillArgs& a) { a.head_dim = 88; }},
      {"head_dim", [](PagedPrefillArgs& a) { a.head_dim = 272; }},
      {"head_dim", [](PagedPrefillArgs& a) { a.head_dim = 0; }},
      {"block_size", [](PagedPrefillArgs& a) { a.block_size = 0; }},
      {"num_kv_heads", [](PagedPrefillArgs& a) { a.num_kv_heads = 3; }},
      {"q_stride", [](PagedPrefillArgs& a) { a.q_stride = 4 * 128 - 8; }},
      {"q_stride", [](PagedPrefillArgs& a) { a.q_stride = 4 * 128 + 4; }},
      {"out_stride", [](PagedPrefillArgs& a) { a.out_stride = 100; }},
      {"value_offset_elems", [](PagedPrefillArgs& a) { a.value_offset_elems = 100; }},
      {"block_stride_elems", [](PagedPrefillArgs& a) { a.block_stride_elems -= 8; }},
      {"batch", [](PagedPrefillArgs& a) { a.batch = -1; }},
      {"max_query_len", [](PagedPrefillArgs& a) { a.max_query_len = -1; }},
      {"scale", [](PagedPrefillArgs& a) { a.scale = 0.0f; }},
      {"null pointer", [](PagedPrefillArgs& a) { a.query_starts = nullptr; }},
      {"aligned", [](PagedPrefillArgs& a) { a.q = static_cast<const char*>(a.q) + 2; }},
      {"wgmma kernel takes head_dim 128",
       [](PagedPrefillArgs& a) {
         a.head_dim = 64;
         a.kernel = PrefillKernel::kWgmma;
       }},
  };
  for (const Bad& b : bad) {
    PagedPrefillArgs args = ValidArgs();
    b.mutate(args);
    EXPECT_THAT(LaunchPagedPrefillAttention(args, nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(b.field)))
        << b.field;
  }
}

TEST(PagedPrefillAttentionArgsTest, EmptyBatchIsANoOpEvenWithNullPointers) {
  PagedPrefillArgs args = ValidArgs();
  args.batch = 0;
  args.q = nullptr;
  args.out = nullptr;
  EXPECT_THAT(LaunchPagedPrefillAttention(args, nullptr), IsOk());
}

}  // namespace
}  // namespace trident::kernels::cuda
