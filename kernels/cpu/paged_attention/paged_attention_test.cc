#include "kernels/cpu/paged_attention/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace trident::kernels::cpu {
namespace {

using numeric::DType;

struct Case {
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t block_size;
  DType dtype;
  // (context_len, query_len) per sequence.
  std::vector<std::pair<int32_t, int32_t>> seqs;
};

// Fills a paged cache for the case through AppendKv (shuffled block ids, so
// block tables are not contiguous), then compares PagedAttention with the
// reference.
double MaxError(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int32_t bs = c.block_size;
  int32_t total_blocks = 0;
  for (auto [ctx, ql] : c.seqs) total_blocks += (ctx + bs - 1) / bs;
  std::vector<int32_t> ids(total_blocks + 3);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);

  PagedKv kv;
  kv.dtype = c.dtype;
  kv.block_size = bs;
  kv.num_kv_heads = c.num_kv_heads;
  kv.head_dim = c.head_dim;
  kv.value_offset_elems = static_cast<int64_t>(c.num_kv_heads) * bs * c.head_dim;
  kv.block_stride_elems = 2 * kv.value_offset_elems;
  std::vector<char> storage(ids.size() * kv.block_stride_elems * numeric::ElementSize(c.dtype));
  kv.base = storage.data();

  const int32_t kv_width = c.num_kv_heads * c.head_dim;
  const int32_t q_width = c.num_q_heads * c.head_dim;
  std::vector<std::vector<int32_t>> tables;
  std::vector<AttentionSequence> seqs;
  int64_t rows = 0;
  size_t next = 0;
  for (auto [ctx, ql] : c.seqs) {
    std::vector<int32_t> table;
    for (int32_t b = 0; b * bs < ctx; ++b) table.push_back(ids[next++]);
    // Write every position's K/V.
    std::vector<float> k(static_cast<size_t>(ctx) * kv_width), v(k.size());
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    std::vector<int64_t> slots(ctx);
    for (int32_t p = 0; p < ctx; ++p) slots[p] = static_cast<int64_t>(table[p / bs]) * bs + p % bs;
    AppendKv(kv, k.data(), kv_width, v.data(), kv_width, slots.data(), ctx);
    tables.push_back(std::move(table));
    seqs.push_back({nullptr, ctx, ql, rows});
    rows += ql;
  }
  for (size_t i = 0; i < seqs.size(); ++i) seqs[i].block_table = tables[i].data();
  // q rows with a wider stride than needed, to exercise strides.
  const int64_t q_stride = q_width + 5;
  std::vector<float> q(rows * q_stride);
  for (auto& x : q) x = normal(rng);
  std::vector<float> out(rows * q_width, -7.0f), ref(rows * q_width, -9.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  PagedAttention(kv, q.data(), q_stride, c.num_q_heads, seqs, scale, out.data(), q_width);
  PagedAttentionReference(kv, q.data(), q_stride, c.num_q_heads, seqs, scale, ref.data(),
                          q_width);
  double worst = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(out[i] - ref[i])));
  }
  return worst;
}

TEST(PagedAttentionTest, MatchesReferenceOverShapes) {
  const uint32_t seed = 42;
  std::printf("seed %u\n", seed);
  const std::vector<Case> cases = {
      // Decode, one token, GQA 1.
      {4, 4, 64, 16, DType::kF32, {{1, 1}}},
      // Decode batch, contexts not multiples of the block size, GQA 4.
      {8, 2, 64, 16, DType::kF32, {{17, 1}, {16, 1}, {33, 1}, {5, 1}}},
      // Prefill whole prompts, GQA 8, head_dim 128.
      {8, 1, 128, 16, DType::kF32, {{40, 40}, {1, 1}, {16, 16}}},
      // Chunked prefill: a later chunk over an existing context.
      {4, 2, 64, 16, DType::kF32, {{70, 23}, {50, 50}}},
      // Mixed decode and prefill in one batch, block size 8.
      {6, 3, 32, 8, DType::kF32, {{9, 1}, {31, 12}, {8, 8}}},
      // bf16 KV.
      {8, 2, 128, 16, DType::kBF16, {{45, 45}, {64, 1}}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const double err = MaxError(cases[i], seed + static_cast<uint32_t>(i));
    // fp32 online softmax vs double reference; bf16 rounding happens in
    // AppendKv and is shared by both, so the same tolerance holds.
    EXPECT_LT(err, 2e-5) << "case " << i;
  }
}

TEST(PagedAttentionTest, BlockTableDeterminesWhatIsRead) {
  // The same K/V reached through different block ids gives the same output.
  EXPECT_LT(MaxError({4, 2, 64, 16, DType::kF32, {{100, 3}}}, 1), 2e-5);
  EXPECT_LT(MaxError({4, 2, 64, 16, DType::kF32, {{100, 3}}}, 2), 2e-5);
}

TEST(PagedAttentionTest, AppendKvRoundsBf16AndPlacesHeadMajor) {
  PagedKv kv;
  kv.dtype = DType::kBF16;
  kv.block_size = 4;
  kv.num_kv_heads = 2;
  kv.head_dim = 2;
  kv.value_offset_elems = 2 * 4 * 2;
  kv.block_stride_elems = 2 * kv.value_offset_elems;
  std::vector<uint16_t> storage(3 * kv.block_stride_elems, 0);
  kv.base = storage.data();
  const float k[4] = {1.0f, 2.0f, 3.0f, 1.00390625f};
  const float v[4] = {-1.0f, -2.0f, -3.0f, -4.0f};
  const int64_t slot = 2 * 4 + 3;  // block 2, offset 3
  AppendKv(kv, k, 4, v, 4, &slot, 1);
  const uint16_t* block = storage.data() + 2 * kv.block_stride_elems;
  // Head 1, token 3: element (1 * 4 + 3) * 2.
  EXPECT_EQ(numeric::Bf16ToFloat(block[(1 * 4 + 3) * 2 + 1]), 1.0f);  // tie rounds to even
  EXPECT_EQ(numeric::Bf16ToFloat(block[(0 * 4 + 3) * 2]), 1.0f);
  EXPECT_EQ(numeric::Bf16ToFloat(block[kv.value_offset_elems + (1 * 4 + 3) * 2]), -3.0f);
}

}  // namespace
}  // namespace trident::kernels::cpu
