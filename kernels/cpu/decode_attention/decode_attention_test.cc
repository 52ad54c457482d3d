#include "kernels/cpu/decode_attention/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/decode_attention/decode_attention_reference.h"

namespace trident::kernels::cpu {
namespace {

using numeric::DType;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr uint32_t kSeed = 20240611;

// One batch: shape, the per-sequence context lengths and the thread count.
struct Shape {
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t block_size;
  std::vector<int32_t> context_lens;
  int32_t num_threads;
};

std::string ShapeString(const Shape& s) {
  return absl::StrCat("q_heads=", s.num_q_heads, " kv_heads=", s.num_kv_heads,
                      " head_dim=", s.head_dim, " block_size=", s.block_size, " contexts={",
                      absl::StrJoin(s.context_lens, ","), "} threads=", s.num_threads);
}

// Strides with slack (unused elements between K and V and between blocks), so
// the kernel must use them rather than assume a packed block.
DecodeKvLayout LayoutFor(DType dtype, const Shape& s,
                         DecodeKvPacking packing = DecodeKvPacking::kRows) {
  const int64_t half = static_cast<int64_t>(s.num_kv_heads) * s.block_size * s.head_dim;
  return DecodeKvLayout{.dtype = dtype,
                        .num_kv_heads = s.num_kv_heads,
                        .head_dim = s.head_dim,
                        .block_size = s.block_size,
                        .block_stride_elems = 2 * half + 96,
                        .value_offset_elems = half + 32,
                        .packing = packing};
}

// The shape with its block size rounded up to what `packing` needs.
Shape ForPacking(Shape s, DecodeKvPacking packing) {
  if (packing == DecodeKvPacking::kPairs) s.block_size = (s.block_size + 31) / 32 * 32;
  return s;
}

// Random KV for every sequence (values in [-1, 1), stored in the layout's
// dtype), random q in [-2, 2), and o/lse buffers for the kernel and the
// reference.
struct Batch {
  DecodeKvLayout layout;
  int32_t num_q_heads = 0;
  std::vector<std::vector<char>> kv;
  std::vector<std::vector<float>> q, o, lse, ref_o, ref_lse;
  std::vector<DecodeSequence> seqs, ref_seqs;
};

// Random values everywhere, then NaN in every K and V element of the last
// block's tokens past the context: stale cache bytes the kernel must not let
// into its sums.
void FillKv(const DecodeKvLayout& layout, int32_t context_len, std::mt19937& rng,
            std::vector<char>* kv) {
  const int64_t blocks = (context_len + layout.block_size - 1) / layout.block_size;
  const size_t elem = numeric::ElementSize(layout.dtype);
  kv->assign(blocks * layout.block_stride_elems * elem, 0);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const int64_t count = blocks * layout.block_stride_elems;
  for (int64_t i = 0; i < count; ++i) {
    const float x = unit(rng);
    char* dst = kv->data() + i * elem;
    if (layout.dtype == DType::kF32) {
      std::memcpy(dst, &x, 4);
    } else {
      const uint16_t bits =
          layout.dtype == DType::kBF16 ? numeric::FloatToBf16(x) : numeric::FloatToHalf(x);
      std::memcpy(dst, &bits, 2);
    }
  }
  const float nan = std::nanf("");
  const uint16_t nan16 = layout.dtype == DType::kBF16 ? 0x7fc0 : 0x7e00;
  for (int32_t t = context_len; t < blocks * layout.block_size; ++t) {
    for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
      for (int32_t d = 0; d < layout.head_dim; ++d) {
        for (bool value : {false, true}) {
          char* dst = kv->data() + DecodeKvElementOffset(layout, t, h, d, value) * elem;
          if (layout.dtype == DType::kF32) {
            std::memcpy(dst, &nan, 4);
          } else {
            std::memcpy(dst, &nan16, 2);
          }
        }
      }
    }
  }
}

Batch MakeBatch(DType dtype, const Shape& s, uint32_t seed,
                DecodeKvPacking packing = DecodeKvPacking::kRows) {
  Batch b;
  b.layout = LayoutFor(dtype, s, packing);
  b.num_q_heads = s.num_q_heads;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> q_dist(-2.0f, 2.0f);
  const size_t n = s.context_lens.size();
  b.kv.resize(n);
  b.q.resize(n);
  b.o.resize(n);
  b.lse.resize(n);
  b.ref_o.resize(n);
  b.ref_lse.resize(n);
  const size_t rows = static_cast<size_t>(s.num_q_heads) * s.head_dim;
  for (size_t i = 0; i < n; ++i) {
    FillKv(b.layout, s.context_lens[i], rng, &b.kv[i]);
    b.q[i].resize(rows);
    for (float& x : b.q[i]) x = q_dist(rng);
    b.o[i].assign(rows, std::nanf(""));
    b.lse[i].assign(s.num_q_heads, std::nanf(""));
    b.ref_o[i].assign(rows, 0.0f);
    b.ref_lse[i].assign(s.num_q_heads, 0.0f);
    b.seqs.push_back(DecodeSequence{b.kv[i].data(), s.context_lens[i], b.q[i].data(), b.o[i].data(),
                                    b.lse[i].data()});
    b.ref_seqs.push_back(DecodeSequence{b.kv[i].data(), s.context_lens[i], b.q[i].data(),
                                        b.ref_o[i].data(), b.ref_lse[i].data()});
  }
  return b;
}

// Absolute tolerance on o (values in [-1, 1]) and lse. f32 and f16 KV are
// computed exactly in fp32; bf16 KV rounds q to bf16 for the q·K products
// (relative 2^-9 per element), which moves scores by ~1e-3, and with kPairs
// the softmax weights to bf16 for P·V (relative 2^-9 per weight).
float Tolerance(DType dtype) { return dtype == DType::kBF16 ? 4e-3f : 2e-5f; }

void ExpectMatches(const Batch& b, float tolerance) {
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    for (size_t j = 0; j < b.o[i].size(); ++j) {
      ASSERT_NEAR(b.o[i][j], b.ref_o[i][j], tolerance * (1.0f + std::abs(b.ref_o[i][j])))
          << "sequence " << i << " o element " << j;
    }
    for (size_t h = 0; h < b.lse[i].size(); ++h) {
      ASSERT_NEAR(b.lse[i][h], b.ref_lse[i][h], tolerance * (1.0f + std::abs(b.ref_lse[i][h])))
          << "sequence " << i << " lse of head " << h;
    }
  }
}

const Shape kShapes[] = {
    {8, 8, 64, 16, {1}, 1},                  // One token.
    {8, 8, 64, 16, {16}, 2},                 // Exactly one block.
    {8, 8, 64, 16, {15, 16, 17}, 3},         // Block boundaries.
    {32, 8, 128, 16, {1, 5000}, 7},          // GQA 4, mixed lengths, threads > cut points.
    {8, 1, 128, 16, {100, 33}, 2},           // GQA 8 on one kv head.
    {32, 8, 128, 32, {31, 32, 33, 700}, 3},  // Larger blocks.
    {4, 2, 16, 7, {1, 6, 7, 8, 50}, 7},      // Odd block size, smallest head_dim.
    {8, 2, 256, 16, {70, 129}, 2},           // Largest head_dim.
    {40, 2, 64, 16, {90}, 3},                // Group of 20 (more than one AMX tile).
    {1, 1, 128, 16, {3000}, 7},              // MHA row, one sequence cut 7 ways.
};

class DecodeAttentionTest
    : public ::testing::TestWithParam<std::tuple<DecodeIsa, DType, DecodeKvPacking>> {
 protected:
  DType dtype() const { return std::get<1>(GetParam()); }
  DecodeKvPacking packing() const { return std::get<2>(GetParam()); }
  // A batch of `shape` (block size adapted to the packing) in the parameter's
  // dtype and packing.
  Batch MakeParamBatch(const Shape& shape, uint32_t seed) const {
    return MakeBatch(dtype(), ForPacking(shape, packing()), seed, packing());
  }

  // The kernel for the parameter's ISA, or null after GTEST_SKIP.
  std::unique_ptr<DecodeAttention> MakeKernel(int32_t max_threads = 8) {
    const DecodeIsa isa = std::get<0>(GetParam());
    if (!DecodeIsaAvailable(isa)) return nullptr;
    absl::StatusOr<std::unique_ptr<DecodeAttention>> kernel =
        DecodeAttention::Create(DecodeAttentionOptions{.max_threads = max_threads,
                                                       .max_sequences = 8,
                                                       .max_q_heads = 64,
                                                       .max_head_dim = 256,
                                                       .isa = isa});
    EXPECT_THAT(kernel.status(), IsOk());
    if (!kernel.ok()) return nullptr;
    EXPECT_EQ((*kernel)->isa(), isa);
    return *std::move(kernel);
  }
};

#define TRIDENT_SKIP_IF_UNAVAILABLE()                                                 \
  if (!DecodeIsaAvailable(std::get<0>(GetParam()))) {                                 \
    GTEST_SKIP() << "this CPU lacks " << DecodeIsaName(std::get<0>(GetParam()))       \
                 << " (avx2: AVX2+FMA+F16C; avx512_bf16: AVX-512F+AVX512-BF16; amx: " \
                    "AMX-TILE+AMX-BF16)";                                             \
  }

TEST_P(DecodeAttentionTest, MatchesReferenceOnEdgeAndServingShapes) {
  TRIDENT_SKIP_IF_UNAVAILABLE();
  const DType dtype = std::get<1>(GetParam());
  std::unique_ptr<DecodeAttention> kernel = MakeKernel();
  ASSERT_NE(kernel, nullptr);
  uint32_t seed = kSeed;
  for (const Shape& original : kShapes) {
    const Shape shape = ForPacking(original, packing());
    SCOPED_TRACE(absl::StrCat(ShapeString(shape), " seed=", seed));
    Batch b = MakeParamBatch(shape, seed++);
    const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
    ASSERT_THAT(
        RunDecodeAttentionOmp(*kernel, b.layout, b.num_q_heads, scale, b.seqs, shape.num_threads),
        IsOk());
    DecodeAttentionReference(b.layout, b.num_q_heads, scale, b.ref_seqs);
    ExpectMatches(b, Tolerance(dtype));
  }
}

TEST_P(DecodeAttentionTest, ThreadCountsGiveTheSameResult) {
  TRIDENT_SKIP_IF_UNAVAILABLE();
  const DType dtype = std::get<1>(GetParam());
  std::unique_ptr<DecodeAttention> kernel = MakeKernel();
  ASSERT_NE(kernel, nullptr);
  const Shape shape = ForPacking({32, 8, 128, 16, {1, 700, 17, 300}, 1}, packing());
  SCOPED_TRACE(absl::StrCat(ShapeString(shape), " seed=", kSeed));
  Batch b = MakeParamBatch(shape, kSeed);
  DecodeAttentionReference(b.layout, b.num_q_heads, 0.1f, b.ref_seqs);
  for (int32_t threads : {1, 2, 3, 7}) {
    SCOPED_TRACE(absl::StrCat("threads=", threads));
    ASSERT_THAT(RunDecodeAttentionOmp(*kernel, b.layout, b.num_q_heads, 0.1f, b.seqs, threads),
                IsOk());
    ExpectMatches(b, Tolerance(dtype));
  }
}

TEST_P(DecodeAttentionTest, OutputsOfTwoHalvesMergeByLseIntoTheWhole) {
  TRIDENT_SKIP_IF_UNAVAILABLE();
  const DType dtype = std::get<1>(GetParam());
  std::unique_ptr<DecodeAttention> kernel = MakeKernel();
  ASSERT_NE(kernel, nullptr);
  const Shape shape = ForPacking({16, 4, 128, 16, {1000}, 3}, packing());
  SCOPED_TRACE(absl::StrCat(ShapeString(shape), " seed=", kSeed));
  Batch b = MakeParamBatch(shape, kSeed);
  // The first 25 blocks, and the rest: a sequence starting at block 25.
  const int32_t first_len = 25 * shape.block_size;
  const size_t elem = numeric::ElementSize(dtype);
  const size_t rows = static_cast<size_t>(shape.num_q_heads) * shape.head_dim;
  std::vector<float> o1(rows), o2(rows), lse1(shape.num_q_heads), lse2(shape.num_q_heads);
  const DecodeSequence halves[] = {
      {b.kv[0].data(), first_len, b.q[0].data(), o1.data(), lse1.data()},
      {b.kv[0].data() + 25 * b.layout.block_stride_elems * elem, 1000 - first_len, b.q[0].data(),
       o2.data(), lse2.data()}};
  const float scale = 0.125f;
  ASSERT_THAT(RunDecodeAttentionOmp(*kernel, b.layout, b.num_q_heads, scale, halves, 2), IsOk());
  DecodeAttentionReference(b.layout, b.num_q_heads, scale, b.ref_seqs);
  for (int32_t h = 0; h < shape.num_q_heads; ++h) {
    const float m = std::max(lse1[h], lse2[h]);
    const float w1 = std::exp(lse1[h] - m);
    const float w2 = std::exp(lse2[h] - m);
    EXPECT_NEAR(m + std::log(w1 + w2), b.ref_lse[0][h], Tolerance(dtype) * 4) << "head " << h;
    for (int32_t j = 0; j < shape.head_dim; ++j) {
      const size_t i = static_cast<size_t>(h) * shape.head_dim + j;
      ASSERT_NEAR((o1[i] * w1 + o2[i] * w2) / (w1 + w2), b.ref_o[0][i], Tolerance(dtype))
          << "head " << h << " dim " << j;
    }
  }
}

// A block table over blocks moved elsewhere, in reverse order, reads the
// same KV as the uniform stride did; with pairs it is refused.
TEST_P(DecodeAttentionTest, ABlockTableReadsBlocksWhereverTheyAre) {
  TRIDENT_SKIP_IF_UNAVAILABLE();
  const DType dtype = std::get<1>(GetParam());
  std::unique_ptr<DecodeAttention> kernel = MakeKernel();
  ASSERT_NE(kernel, nullptr);
  const Shape shape = ForPacking({32, 8, 128, 16, {1, 40, 700, 33}, 3}, packing());
  SCOPED_TRACE(absl::StrCat(ShapeString(shape), " seed=", kSeed));
  Batch b = MakeParamBatch(shape, kSeed);
  const size_t block_bytes = b.layout.block_stride_elems * numeric::ElementSize(dtype);
  std::vector<std::vector<char>> moved(b.seqs.size());
  std::vector<std::vector<const void*>> tables(b.seqs.size());
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const size_t blocks = b.kv[i].size() / block_bytes;
    moved[i].resize(b.kv[i].size());
    tables[i].resize(blocks);
    for (size_t k = 0; k < blocks; ++k) {
      char* to = moved[i].data() + (blocks - 1 - k) * block_bytes;
      std::memcpy(to, b.kv[i].data() + k * block_bytes, block_bytes);
      tables[i][k] = to;
    }
    b.seqs[i].kv = nullptr;
    b.seqs[i].blocks = tables[i].data();
  }
  const float scale = 0.1f;
  const absl::Status status =
      RunDecodeAttentionOmp(*kernel, b.layout, b.num_q_heads, scale, b.seqs, shape.num_threads);
  if (packing() == DecodeKvPacking::kPairs) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block table")));
    return;
  }
  ASSERT_THAT(status, IsOk());
  DecodeAttentionReference(b.layout, b.num_q_heads, scale, b.ref_seqs);
  ExpectMatches(b, Tolerance(dtype));
  // The reference through the table agrees with itself over the stride.
  std::vector<DecodeSequence> ref_tables = b.ref_seqs;
  std::vector<std::vector<float>> o2(b.seqs.size());
  for (size_t i = 0; i < ref_tables.size(); ++i) {
    o2[i].assign(b.ref_o[i].size(), 0.0f);
    ref_tables[i].kv = nullptr;
    ref_tables[i].blocks = tables[i].data();
    ref_tables[i].o = o2[i].data();
    ref_tables[i].lse = nullptr;
  }
  DecodeAttentionReference(b.layout, b.num_q_heads, scale, ref_tables);
  for (size_t i = 0; i < o2.size(); ++i) EXPECT_EQ(o2[i], b.ref_o[i]) << "sequence " << i;
}

std::string ParamName(
    const ::testing::TestParamInfo<std::tuple<DecodeIsa, DType, DecodeKvPacking>>& info) {
  return absl::StrCat(DecodeIsaName(std::get<0>(info.param)), "_",
                      numeric::DTypeName(std::get<1>(info.param)), "_",
                      DecodeKvPackingName(std::get<2>(info.param)));
}

INSTANTIATE_TEST_SUITE_P(
    IsasAndDtypes, DecodeAttentionTest,
    ::testing::Combine(::testing::Values(DecodeIsa::kAvx2, DecodeIsa::kAvx512Bf16, DecodeIsa::kAmx),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(DecodeKvPacking::kRows)),
    ParamName);

INSTANTIATE_TEST_SUITE_P(
    IsasPairs, DecodeAttentionTest,
    ::testing::Combine(::testing::Values(DecodeIsa::kAvx2, DecodeIsa::kAvx512Bf16, DecodeIsa::kAmx),
                       ::testing::Values(DType::kBF16), ::testing::Values(DecodeKvPacking::kPairs)),
    ParamName);

TEST(DecodeAttentionAppendTest, StoresTokensInTheLayoutAndTouchesNothingElse) {
  for (const auto& [dtype, packing] : {std::pair{DType::kF32, DecodeKvPacking::kRows},
                                       {DType::kBF16, DecodeKvPacking::kRows},
                                       {DType::kF16, DecodeKvPacking::kRows},
                                       {DType::kBF16, DecodeKvPacking::kPairs}}) {
    SCOPED_TRACE(absl::StrCat(numeric::DTypeName(dtype), " ", DecodeKvPackingName(packing)));
    const Shape shape = ForPacking({8, 2, 32, 16, {}, 1}, packing);
    const DecodeKvLayout layout = LayoutFor(dtype, shape, packing);
    const size_t elem = numeric::ElementSize(dtype);
    std::vector<std::vector<char>> caches(
        2, std::vector<char>(4 * layout.block_stride_elems * elem, 0x5a));
    const std::vector<char> untouched = caches[0];
    std::mt19937 rng(kSeed);
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    const size_t n = static_cast<size_t>(shape.num_kv_heads) * shape.head_dim;
    const int32_t positions[] = {0, 15, 16, 50};
    std::vector<std::vector<float>> k(4, std::vector<float>(n)), v = k;
    std::vector<DecodeKvAppend> tokens;
    for (int i = 0; i < 4; ++i) {
      for (float& x : k[i]) x = dist(rng);
      for (float& x : v[i]) x = dist(rng);
      tokens.push_back(
          DecodeKvAppend{caches[i % 2].data(), positions[i], k[i].data(), v[i].data()});
    }
    ASSERT_THAT(AppendDecodeKv(layout, tokens), IsOk());
    auto rounded = [&](float x) {
      return dtype == DType::kF32    ? x
             : dtype == DType::kBF16 ? numeric::Bf16ToFloat(numeric::FloatToBf16(x))
                                     : numeric::HalfToFloat(numeric::FloatToHalf(x));
    };
    for (int i = 0; i < 4; ++i) {
      for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
        for (int32_t j = 0; j < shape.head_dim; ++j) {
          const float kj = k[i][h * shape.head_dim + j];
          const float vj = v[i][h * shape.head_dim + j];
          ASSERT_EQ(ReadDecodeKvElement(layout, caches[i % 2].data(), positions[i], h, j, false),
                    rounded(kj));
          ASSERT_EQ(ReadDecodeKvElement(layout, caches[i % 2].data(), positions[i], h, j, true),
                    rounded(vj));
        }
      }
    }
    // Cache 0 got two tokens (positions 0 and 16): at most their k and v
    // rows differ from the sentinel fill.
    size_t changed = 0;
    for (size_t byte = 0; byte < untouched.size(); ++byte) {
      changed += caches[0][byte] != untouched[byte];
    }
    EXPECT_LE(changed, 2 * 2 * n * elem) << "more bytes changed than two tokens' k and v";
  }
}

TEST(DecodeAttentionAppendTest, Bf16RowsAreStoredAsTheirF32ValuesWouldBe) {
  for (const DecodeKvPacking packing : {DecodeKvPacking::kRows, DecodeKvPacking::kPairs}) {
    SCOPED_TRACE(DecodeKvPackingName(packing));
    const Shape shape = ForPacking({8, 2, 32, 16, {}, 1}, packing);
    const DecodeKvLayout layout = LayoutFor(DType::kBF16, shape, packing);
    std::vector<char> from_f32(4 * layout.block_stride_elems * 2, 0x5a), from_bf16 = from_f32;
    std::mt19937 rng(kSeed);
    std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
    const size_t n = static_cast<size_t>(shape.num_kv_heads) * shape.head_dim;
    std::vector<float> k(n), v(n);
    for (float& x : k) x = dist(rng);
    for (float& x : v) x = dist(rng);
    std::vector<uint16_t> k_bits(n), v_bits(n);
    numeric::FloatToBf16(k.data(), k_bits.data(), n);
    numeric::FloatToBf16(v.data(), v_bits.data(), n);
    for (const int32_t position : {0, 1, 31, 32, 63}) {
      ASSERT_THAT(AppendDecodeKv(layout, {{{from_f32.data(), position, k.data(), v.data()}}}),
                  IsOk());
      DecodeKvAppend bits{.kv = from_bf16.data(), .position = position};
      bits.k_bf16 = k_bits.data();
      bits.v_bf16 = v_bits.data();
      ASSERT_THAT(AppendDecodeKv(layout, {{bits}}), IsOk());
    }
    EXPECT_EQ(from_bf16, from_f32);
  }
}

TEST(DecodeAttentionAppendTest, RejectsMixedOrMisplacedBf16Rows) {
  const DecodeKvLayout layout = LayoutFor(DType::kBF16, Shape{8, 2, 32, 16, {}, 1});
  std::vector<char> cache(layout.block_stride_elems * 4);
  std::vector<float> k(64), v(64);
  std::vector<uint16_t> bits(64);
  DecodeKvAppend mixed{.kv = cache.data(), .position = 0, .k = k.data(), .v = v.data()};
  mixed.k_bf16 = bits.data();
  mixed.v_bf16 = bits.data();
  EXPECT_THAT(AppendDecodeKv(layout, {{mixed}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("both f32")));
  DecodeKvAppend half{.kv = cache.data(), .position = 0};
  half.k_bf16 = bits.data();
  EXPECT_THAT(AppendDecodeKv(layout, {{half}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens[0].v_bf16")));
  half.v_bf16 = bits.data();
  const DecodeKvLayout f32 = LayoutFor(DType::kF32, Shape{8, 2, 32, 16, {}, 1});
  std::vector<char> f32_cache(f32.block_stride_elems * 8);
  half.kv = f32_cache.data();
  EXPECT_THAT(AppendDecodeKv(f32, {{half}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bf16 rows for a f32")));
}

TEST(DecodeAttentionAppendTest, RejectsNullPointersAndNegativePositions) {
  const DecodeKvLayout layout = LayoutFor(DType::kBF16, Shape{8, 2, 32, 16, {}, 1});
  std::vector<char> cache(layout.block_stride_elems * 2);
  std::vector<float> k(64), v(64);
  EXPECT_THAT(AppendDecodeKv(layout, {{{nullptr, 0, k.data(), v.data()}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens[0].kv")));
  EXPECT_THAT(AppendDecodeKv(layout, {{{cache.data(), 0, k.data(), nullptr}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens[0].v")));
  EXPECT_THAT(AppendDecodeKv(layout, {{{cache.data(), -1, k.data(), v.data()}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens[0].position")));
  DecodeKvLayout bad = layout;
  bad.head_dim = 24;
  EXPECT_THAT(AppendDecodeKv(bad, {{{cache.data(), 0, k.data(), v.data()}}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layout.head_dim")));
}

TEST(DecodeAttentionCreateTest, ForcingAnIsaTheCpuLacksFailsPrecondition) {
  for (DecodeIsa isa : {DecodeIsa::kAmx, DecodeIsa::kAvx512Bf16, DecodeIsa::kAvx2}) {
    if (DecodeIsaAvailable(isa)) continue;
    EXPECT_THAT(DecodeAttention::Create(DecodeAttentionOptions{.isa = isa}).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(DecodeIsaName(isa))));
    return;
  }
  GTEST_SKIP() << "this CPU has every decode attention ISA (avx2, avx512_bf16, amx)";
}

TEST(DecodeAttentionCreateTest, AutoPicksAnAvailableIsaAndNamesIt) {
  absl::StatusOr<std::unique_ptr<DecodeAttention>> kernel =
      DecodeAttention::Create(DecodeAttentionOptions{});
  if (!DecodeIsaAvailable(DecodeIsa::kAvx2)) {
    EXPECT_THAT(kernel.status(), StatusIs(absl::StatusCode::kFailedPrecondition));
    return;
  }
  ASSERT_THAT(kernel.status(), IsOk());
  EXPECT_NE((*kernel)->isa(), DecodeIsa::kAuto);
  EXPECT_TRUE(DecodeIsaAvailable((*kernel)->isa()));
  EXPECT_NE(DecodeIsaName((*kernel)->isa()), "auto");
  std::cout << "auto picked " << DecodeIsaName((*kernel)->isa()) << "\n";
}

TEST(DecodeAttentionCreateTest, RejectsBadOptions) {
  EXPECT_THAT(DecodeAttention::Create(DecodeAttentionOptions{.max_threads = 0}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("options.max_threads")));
  EXPECT_THAT(DecodeAttention::Create(DecodeAttentionOptions{.max_sequences = -1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("options.max_sequences")));
  EXPECT_THAT(DecodeAttention::Create(DecodeAttentionOptions{.max_q_heads = 0}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("options.max_q_heads")));
  EXPECT_THAT(DecodeAttention::Create(DecodeAttentionOptions{.max_head_dim = 100}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("options.max_head_dim")));
  EXPECT_THAT(DecodeAttention::Create(DecodeAttentionOptions{.max_head_dim = 272}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("options.max_head_dim")));
}

TEST(DecodeAttentionPlanTest, RejectsInvalidArgumentsNamingTheField) {
  if (!DecodeIsaAvailable(DecodeIsa::kAvx2)) GTEST_SKIP() << "this CPU lacks avx2";
  absl::StatusOr<std::unique_ptr<DecodeAttention>> created =
      DecodeAttention::Create(DecodeAttentionOptions{
          .max_threads = 4, .max_sequences = 2, .max_q_heads = 16, .max_head_dim = 128});
  ASSERT_THAT(created.status(), IsOk());
  DecodeAttention& kernel = **created;
  const Shape shape{8, 2, 64, 16, {40}, 1};
  Batch b = MakeBatch(DType::kBF16, shape, kSeed);
  ASSERT_THAT(kernel.Plan(b.layout, 8, 0.1f, b.seqs, 2), IsOk());
  EXPECT_EQ(kernel.planned_threads(), 2);

  auto expect_invalid = [&](const DecodeKvLayout& layout, int32_t q_heads, float scale,
                            std::vector<DecodeSequence> seqs, int32_t threads,
                            const std::string& field) {
    EXPECT_THAT(kernel.Plan(layout, q_heads, scale, seqs, threads),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(field)));
    EXPECT_EQ(kernel.planned_threads(), 0);
  };
  DecodeKvLayout l = b.layout;
  l.dtype = static_cast<DType>(7);
  expect_invalid(l, 8, 0.1f, b.seqs, 1, "layout.dtype");
  l = b.layout;
  l.num_kv_heads = 0;
  expect_invalid(l, 8, 0.1f, b.seqs, 1, "layout.num_kv_heads");
  l = b.layout;
  l.block_size = 0;
  expect_invalid(l, 8, 0.1f, b.seqs, 1, "layout.block_size");
  for (int32_t head_dim : {0, 8, 72, 256}) {  // 256 > options.max_head_dim.
    l = b.layout;
    l.head_dim = head_dim;
    expect_invalid(l, 8, 0.1f, b.seqs, 1, "layout.head_dim");
  }
  l = b.layout;
  l.packing = DecodeKvPacking::kPairs;  // Block size 16.
  expect_invalid(l, 8, 0.1f, b.seqs, 1, "layout.packing");
  l.block_size = 32;
  l.dtype = DType::kF32;
  expect_invalid(l, 8, 0.1f, b.seqs, 1, "layout.packing");
  l = b.layout;
  l.value_offset_elems = 2 * 16 * 64 - 1;
  expect_invalid(l, 8, 0.1f, b.seqs, 1, "layout.value_offset_elems");
  l = b.layout;
  l.block_stride_elems = l.value_offset_elems + 2 * 16 * 64 - 1;
  expect_invalid(l, 8, 0.1f, b.seqs, 1, "layout.block_stride_elems");
  expect_invalid(b.layout, 7, 0.1f, b.seqs, 1, "num_q_heads");
  expect_invalid(b.layout, 32, 0.1f, b.seqs, 1, "num_q_heads");  // > max_q_heads.
  expect_invalid(b.layout, 8, std::nanf(""), b.seqs, 1, "scale");
  expect_invalid(b.layout, 8, 0.1f, b.seqs, 0, "num_threads");
  expect_invalid(b.layout, 8, 0.1f, b.seqs, 5, "num_threads");
  expect_invalid(b.layout, 8, 0.1f, {b.seqs[0], b.seqs[0], b.seqs[0]}, 1, "max_sequences");
  for (const auto& [field, mutate] : std::vector<std::pair<std::string, void (*)(DecodeSequence&)>>{
           {"seqs[1].kv", [](DecodeSequence& s) { s.kv = nullptr; }},
           {"seqs[1].q", [](DecodeSequence& s) { s.q = nullptr; }},
           {"seqs[1].o", [](DecodeSequence& s) { s.o = nullptr; }},
           {"seqs[1].context_len", [](DecodeSequence& s) { s.context_len = 0; }}}) {
    DecodeSequence bad = b.seqs[0];
    mutate(bad);
    expect_invalid(b.layout, 8, 0.1f, {b.seqs[0], bad}, 1, field);
  }
}

}  // namespace
}  // namespace trident::kernels::cpu
