#include "kernels/cpu/paged_attention/paged_attention.h"

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
#include "kernels/cpu/paged_attention/paged_attention_reference.h"

namespace trident::kernels::cpu {
namespace {

using ::testing::HasSubstr;
using ::trident::numeric::DType;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr uint32_t kSeed = 777;

struct SeqShape {
  int32_t context_len;
  int32_t query_len;
};

struct Config {
  DType dtype;
  int32_t head_dim;
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t block_size = 16;
};

std::string ConfigName(const ::testing::TestParamInfo<Config>& info) {
  const Config& c = info.param;
  return std::string(numeric::DTypeName(c.dtype)) + "Dim" + std::to_string(c.head_dim) + "Q" +
         std::to_string(c.num_q_heads) + "Kv" + std::to_string(c.num_kv_heads) + "Block" +
         std::to_string(c.block_size);
}

// A paged cache with padding between K, V and blocks, unwritten slots holding
// NaN (so any read of them poisons the output), sequences on shuffled blocks,
// and q/out rows wider than the heads they hold.
class Batch {
 public:
  Batch(const Config& c, const std::vector<SeqShape>& shapes, float q_scale, uint32_t seed)
      : config_(c), rng_(seed) {
    const int64_t half = static_cast<int64_t>(c.num_kv_heads) * c.block_size * c.head_dim;
    kv_.dtype = c.dtype;
    kv_.block_size = c.block_size;
    kv_.num_kv_heads = c.num_kv_heads;
    kv_.head_dim = c.head_dim;
    kv_.value_offset_elems = half + 3;
    kv_.block_stride_elems = 2 * half + 11;
    int32_t num_blocks = 3;  // Spare blocks that no sequence uses.
    for (const SeqShape& s : shapes)
      num_blocks += (s.context_len + c.block_size - 1) / c.block_size;
    const size_t elems = static_cast<size_t>(num_blocks) * kv_.block_stride_elems;
    if (c.dtype == DType::kF32) {
      f32_.assign(elems, NAN);
      kv_.base = f32_.data();
    } else {
      bf16_.assign(elems, numeric::FloatToBf16(NAN));
      kv_.base = bf16_.data();
    }
    std::vector<int32_t> physical(num_blocks);
    std::iota(physical.begin(), physical.end(), 0);
    std::shuffle(physical.begin(), physical.end(), rng_);

    const int32_t kv_row = c.num_kv_heads * c.head_dim;
    q_stride_ = (c.num_q_heads + 2 * c.num_kv_heads) * c.head_dim;  // A fused qkv row.
    out_stride_ = c.num_q_heads * c.head_dim + 5;
    std::normal_distribution<float> unit(0.0f, 1.0f);
    tables_.resize(shapes.size());
    int64_t next_row = 0;
    int32_t next_block = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const SeqShape& s = shapes[i];
      for (int32_t b = 0; b < (s.context_len + c.block_size - 1) / c.block_size; ++b) {
        tables_[i].push_back(physical[next_block++]);
      }
      std::vector<float> k(static_cast<size_t>(s.context_len) * kv_row);
      std::vector<float> v(k.size());
      for (float& x : k) x = unit(rng_);
      for (float& x : v) x = unit(rng_);
      std::vector<int64_t> slots(s.context_len);
      for (int32_t p = 0; p < s.context_len; ++p) {
        slots[p] =
            static_cast<int64_t>(tables_[i][p / c.block_size]) * c.block_size + p % c.block_size;
      }
      AppendKv(kv_, k.data(), kv_row, v.data(), kv_row, slots.data(), s.context_len);
      seqs_.push_back(AttentionSequence{nullptr, s.context_len, s.query_len, next_row});
      next_row += s.query_len;
    }
    for (size_t i = 0; i < shapes.size(); ++i) seqs_[i].block_table = tables_[i].data();
    num_rows_ = next_row;
    q_.resize(num_rows_ * q_stride_);
    for (float& x : q_) x = unit(rng_) * q_scale;
  }

  // Runs the kernel and the reference; expects agreement and untouched gaps.
  void ExpectMatchesReference(float tolerance) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
    std::vector<float> out(num_rows_ * out_stride_, NAN);
    std::vector<float> want(out.size(), NAN);
    PagedAttention(kv_, q_.data(), q_stride_, config_.num_q_heads, seqs_, scale, out.data(),
                   out_stride_);
    PagedAttentionReference(kv_, q_.data(), q_stride_, config_.num_q_heads, seqs_, scale,
                            want.data(), out_stride_);
    const int64_t width = static_cast<int64_t>(config_.num_q_heads) * config_.head_dim;
    float max_error = 0.0f;
    for (int64_t r = 0; r < num_rows_; ++r) {
      for (int64_t i = 0; i < out_stride_; ++i) {
        const float got = out[r * out_stride_ + i];
        if (i >= width) {
          ASSERT_TRUE(std::isnan(got)) << "row " << r << " column " << i << " past the heads";
          continue;
        }
        const float expected = want[r * out_stride_ + i];
        ASSERT_NEAR(got, expected, tolerance)
            << "row " << r << " head " << i / config_.head_dim << " dim " << i % config_.head_dim;
        max_error = std::max(max_error, std::abs(got - expected));
      }
    }
    ::testing::Test::RecordProperty("max_error", std::to_string(max_error));
  }

  const PagedKv& kv() const { return kv_; }
  const std::vector<AttentionSequence>& seqs() const { return seqs_; }

 private:
  Config config_;
  std::mt19937 rng_;
  PagedKv kv_;
  std::vector<float> f32_;
  std::vector<uint16_t> bf16_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<AttentionSequence> seqs_;
  std::vector<float> q_;
  int64_t q_stride_ = 0;
  int64_t out_stride_ = 0;
  int64_t num_rows_ = 0;
};

// fp32 accumulation and the polynomial exp against double: outputs are convex
// combinations of N(0, 1) values. The sums' order, hence their rounding,
// differs between builds (vectorized at -O2, scalar in the -O1 sanitizer
// builds, which reach 2.01e-5 at head_dim 128): 5e-5 holds for both, and a
// wrong weight or position is off by orders more.
constexpr float kTolerance = 5e-5f;

class PagedAttentionTest : public ::testing::TestWithParam<Config> {};

TEST_P(PagedAttentionTest, DecodeBatchWithRaggedContexts) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  // Contexts of 1 token, one block exactly, and not a multiple of the block.
  Batch batch(GetParam(), {{1, 1}, {16, 1}, {37, 1}, {100, 1}, {3, 1}}, 1.0f, kSeed);
  batch.ExpectMatchesReference(kTolerance);
}

TEST_P(PagedAttentionTest, PrefillIsCausal) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  Batch batch(GetParam(), {{50, 50}, {1, 1}, {17, 17}}, 1.0f, kSeed + 1);
  batch.ExpectMatchesReference(kTolerance);
}

TEST_P(PagedAttentionTest, ChunkedPrefillMixedWithDecode) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  Batch batch(GetParam(), {{83, 20}, {40, 1}, {70, 33}, {129, 64}}, 1.0f, kSeed + 2);
  batch.ExpectMatchesReference(kTolerance);
}

TEST_P(PagedAttentionTest, LongContextDecodeSplitsAndMerges) {
  // One sequence gives fewer (sequence, kv head) items than threads, so the
  // context is split into chunks that are merged (with >= 2 OpenMP threads).
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  Batch batch(GetParam(), {{1500, 1}}, 1.0f, kSeed + 3);
  batch.ExpectMatchesReference(kTolerance);
}

TEST_P(PagedAttentionTest, LongContextChunkedPrefill) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  Batch batch(GetParam(), {{1100, 40}}, 1.0f, kSeed + 4);
  batch.ExpectMatchesReference(kTolerance);
}

TEST_P(PagedAttentionTest, PeakedScoresKeepTheRunningMaxExact) {
  // q scaled by 8: scores spread over tens of units, so the softmax is
  // dominated by a few positions found at different chunks.
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  Batch batch(GetParam(), {{300, 1}, {90, 30}, {1200, 1}}, 8.0f, kSeed + 5);
  batch.ExpectMatchesReference(kTolerance);
}

INSTANTIATE_TEST_SUITE_P(
    DtypesHeadDimsAndGqa, PagedAttentionTest,
    ::testing::Values(Config{DType::kF32, 64, 2, 2}, Config{DType::kF32, 128, 8, 2},
                      Config{DType::kF32, 64, 16, 2}, Config{DType::kBF16, 128, 2, 2},
                      Config{DType::kBF16, 64, 8, 2}, Config{DType::kBF16, 128, 16, 2},
                      Config{DType::kBF16, 128, 32, 8}, Config{DType::kF32, 64, 4, 1, 7},
                      Config{DType::kBF16, 128, 8, 2, 1}),
    ConfigName);

TEST(AppendKvTest, WritesSlotsSkipsPaddingAndRoundsToBf16) {
  // 2 blocks of 4 tokens, 2 kv heads, head_dim 3, gaps between K, V and blocks.
  const PagedKv layout{nullptr, DType::kBF16, 4, 2, 3, /*block_stride=*/60, /*value_offset=*/30};
  std::vector<uint16_t> cache(120, 0xFFFF);
  PagedKv kv = layout;
  kv.base = cache.data();
  ASSERT_THAT(ValidatePagedKv(kv), IsOk());
  // Two tokens, rows [head0 | head1] with a stride of 8.
  std::vector<float> k(16), v(16);
  for (int i = 0; i < 16; ++i) {
    k[i] = 1.0f + i + 1.0f / 512;  // Not representable in bf16: rounds.
    v[i] = -1.0f - i;
  }
  const int64_t slots[] = {6, -1};
  AppendKv(kv, k.data(), 8, v.data(), 8, slots, 2);
  const int32_t table[] = {0, 1};
  int written = 0;
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(ReadCachedElement(kv, table, 6, h, i, false),
                numeric::Bf16ToFloat(numeric::FloatToBf16(k[h * 3 + i])));
      EXPECT_EQ(ReadCachedElement(kv, table, 6, h, i, true), v[h * 3 + i]);
      written += 2;
    }
  }
  int untouched = 0;
  for (uint16_t x : cache) untouched += x == 0xFFFF;
  EXPECT_EQ(untouched, 120 - written);  // Token 1 (slot -1) wrote nothing.
}

TEST(AppendKvTest, F32IsExact) {
  const int32_t d = 5;
  // 2 blocks of 8 tokens, 2 kv heads, K and V packed back to back.
  const int64_t half = 2 * 8 * d;
  std::vector<float> cache(2 * 2 * half, NAN);
  const PagedKv kv{cache.data(), DType::kF32, 8, 2, d, 2 * half, half};
  ASSERT_THAT(ValidatePagedKv(kv), IsOk());
  std::vector<float> k(3 * 2 * d), v(3 * 2 * d);
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = 0.1f * i;
    v[i] = -0.3f * i;
  }
  const int64_t slots[] = {0, 9, 15};
  AppendKv(kv, k.data(), 2 * d, v.data(), 2 * d, slots, 3);
  const int32_t table[] = {0, 1};
  for (int t = 0; t < 3; ++t) {
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < d; ++i) {
        EXPECT_EQ(ReadCachedElement(kv, table, slots[t], h, i, false), k[t * 2 * d + h * d + i]);
        EXPECT_EQ(ReadCachedElement(kv, table, slots[t], h, i, true), v[t * 2 * d + h * d + i]);
      }
    }
  }
}

TEST(ValidatePagedKvTest, NamesTheBadField) {
  float storage[1];
  const PagedKv good{storage, DType::kF32, 16, 2, 64, 2 * 2 * 16 * 64, 2 * 16 * 64};
  EXPECT_THAT(ValidatePagedKv(good), IsOk());
  PagedKv bad = good;
  bad.base = nullptr;
  EXPECT_THAT(ValidatePagedKv(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("base")));
  bad = good;
  bad.dtype = DType::kF16;
  EXPECT_THAT(ValidatePagedKv(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("dtype")));
  bad = good;
  bad.block_size = 0;
  EXPECT_THAT(ValidatePagedKv(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_size")));
  bad = good;
  bad.value_offset_elems = good.value_offset_elems - 1;
  EXPECT_THAT(ValidatePagedKv(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("value_offset_elems")));
  bad = good;
  bad.block_stride_elems = good.block_stride_elems - 1;
  EXPECT_THAT(ValidatePagedKv(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_stride_elems")));
}

}  // namespace
}  // namespace trident::kernels::cpu
