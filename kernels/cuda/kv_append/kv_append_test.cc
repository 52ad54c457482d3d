#include "kernels/cuda/kv_append/kv_append.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/paged_attention/paged_attention.h"
#include "kernels/cpu/paged_kv_fp8/paged_kv_fp8.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

struct Case {
  int32_t head_dim;
  int32_t num_kv_heads;
  int32_t block_size;
  int64_t num_blocks;
  int64_t layout_pad;  // Extra elements after a block's K and after its V.
  int64_t start;       // Position of the first token in its sequence.
  int64_t num_tokens;
  bool holes;  // Every 5th token padding (-1), the last one out of range.
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "head_dim " << c.head_dim << ", kv heads " << c.num_kv_heads << ", block_size "
      << c.block_size << ", blocks " << c.num_blocks << ", layout pad " << c.layout_pad
      << ", positions [" << c.start << ", " << c.start + c.num_tokens << ")"
      << (c.holes ? ", holes" : "");
}

class KvAppendTest : public ::testing::TestWithParam<Case> {};

TEST_P(KvAppendTest, CacheBytesMatchCpuAppendKv) {
  const Case c = GetParam();
  constexpr uint32_t kSeed = 99;
  std::printf("seed %u\n", kSeed);
  std::mt19937 rng(kSeed);
  const int64_t kv_width = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const int64_t q_width = 4 * kv_width;  // GQA 4:1, as in a fused qkv row.
  const int64_t width = q_width + 2 * kv_width;
  const int64_t half = kv_width * c.block_size;
  cpu::PagedKv cpu_kv;
  cpu_kv.dtype = numeric::DType::kBF16;
  cpu_kv.block_size = c.block_size;
  cpu_kv.num_kv_heads = c.num_kv_heads;
  cpu_kv.head_dim = c.head_dim;
  cpu_kv.value_offset_elems = half + c.layout_pad;
  cpu_kv.block_stride_elems = 2 * (half + c.layout_pad);
  const size_t cache_elems = static_cast<size_t>(c.num_blocks * cpu_kv.block_stride_elems);

  // Random cache contents and qkv rows (bf16 bits); untouched bytes must stay.
  std::vector<uint16_t> cache(cache_elems);
  for (uint16_t& x : cache) x = static_cast<uint16_t>(rng());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> qkv(static_cast<size_t>(c.num_tokens * width));
  std::vector<float> qkv_f(qkv.size());
  for (size_t i = 0; i < qkv.size(); ++i) {
    qkv[i] = numeric::FloatToBf16(normal(rng));
    qkv_f[i] = numeric::Bf16ToFloat(qkv[i]);
  }
  // The sequence's blocks, shuffled: consecutive positions cross blocks.
  std::vector<int64_t> block_table(c.num_blocks);
  std::iota(block_table.begin(), block_table.end(), 0);
  std::shuffle(block_table.begin(), block_table.end(), rng);
  std::vector<int64_t> gpu_slots(c.num_tokens);
  std::vector<int64_t> cpu_slots(c.num_tokens);
  for (int64_t i = 0; i < c.num_tokens; ++i) {
    const int64_t p = c.start + i;
    gpu_slots[i] = block_table[p / c.block_size] * c.block_size + p % c.block_size;
    cpu_slots[i] = gpu_slots[i];
    if (c.holes && i % 5 == 2) gpu_slots[i] = cpu_slots[i] = -1;
  }
  if (c.holes) {
    gpu_slots.back() = c.num_blocks * c.block_size + 3;  // Past the cache: skipped.
    cpu_slots.back() = -1;
  }

  std::vector<uint16_t> expected = cache;
  cpu_kv.base = expected.data();
  ASSERT_TRUE(cpu::ValidatePagedKv(cpu_kv).ok());
  cpu::AppendKv(cpu_kv, qkv_f.data() + q_width, width, qkv_f.data() + q_width + kv_width, width,
                cpu_slots.data(), c.num_tokens);

  uint16_t* d_cache = nullptr;
  uint16_t* d_qkv = nullptr;
  int64_t* d_slots = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_cache), cache_elems * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_qkv), qkv.size() * 2 + 16), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_slots), gpu_slots.size() * 8 + 8), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_cache, cache.data(), cache_elems * 2, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_qkv, qkv.data(), qkv.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_slots, gpu_slots.data(), gpu_slots.size() * 8, cudaMemcpyHostToDevice),
            cudaSuccess);
  const PagedKvBf16 kv{.base = d_cache,
                       .num_blocks = c.num_blocks,
                       .block_size = c.block_size,
                       .num_kv_heads = c.num_kv_heads,
                       .head_dim = c.head_dim,
                       .block_stride_elems = cpu_kv.block_stride_elems,
                       .value_offset_elems = cpu_kv.value_offset_elems};
  ASSERT_THAT(LaunchKvAppend({.kv = kv,
                              .k = d_qkv + q_width,
                              .k_stride = width,
                              .v = d_qkv + q_width + kv_width,
                              .v_stride = width,
                              .slots = d_slots,
                              .num_tokens = c.num_tokens},
                             nullptr),
              IsOk());
  std::vector<uint16_t> got(cache_elems);
  ASSERT_EQ(cudaMemcpy(got.data(), d_cache, cache_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d_cache);
  cudaFree(d_qkv);
  cudaFree(d_slots);
  int64_t bad = 0;
  for (size_t i = 0; i < cache_elems; ++i) {
    if (got[i] != expected[i] && ++bad <= 5) {
      const int64_t block = static_cast<int64_t>(i) / cpu_kv.block_stride_elems;
      const int64_t in_block = static_cast<int64_t>(i) % cpu_kv.block_stride_elems;
      ADD_FAILURE() << "cache element " << i << " (block " << block << ", element " << in_block
                    << " of it): got 0x" << std::hex << got[i] << ", want 0x" << expected[i]
                    << std::dec;
    }
  }
  EXPECT_EQ(bad, 0) << "cache elements differ from the CPU AppendKv";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, KvAppendTest,
    ::testing::Values(Case{128, 8, 16, 4, 0, 0, 1, false},    // One token, slot 0 of a block.
                      Case{128, 8, 16, 4, 0, 63, 1, false},   // One token, last slot.
                      Case{64, 1, 16, 6, 0, 13, 40, false},   // Crosses 3 block boundaries.
                      Case{128, 8, 16, 8, 8, 5, 100, true},   // Padded layout, holes.
                      Case{128, 8, 16, 8, 1, 0, 128, false},  // Odd pad: scalar path, full.
                      Case{6, 2, 4, 5, 0, 2, 17, true},       // head_dim % 8 != 0.
                      Case{128, 4, 1, 33, 0, 0, 33, false},   // block_size 1.
                      Case{64, 8, 32, 3, 0, 31, 2, false}));  // Boundary inside block_size 32.

// The FP8 cache bytes (elements, their order, and the scales) equal
// cpu::AppendKvFp8's from the same bf16 rows, for every head_dim the kernels
// take, with padding, an out-of-range slot and a V that crosses 16-token
// groups; untouched bytes stay.
TEST(KvAppendFp8Test, CacheBytesMatchCpuAppendKvFp8) {
  constexpr uint32_t kSeed = 7;
  std::printf("seed %u\n", kSeed);
  for (int32_t head_dim : {16, 64, 80, 128, 256}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << head_dim);
    std::mt19937 rng(kSeed + head_dim);
    const int32_t heads = 3;
    const int32_t block_size = 32;
    const int64_t num_blocks = 5;
    const int64_t num_tokens = 70;
    const int64_t row = static_cast<int64_t>(heads) * head_dim;
    const int64_t block_bytes = cpu::Fp8BlockBytes(block_size, heads, head_dim);
    std::vector<unsigned char> cache(static_cast<size_t>(num_blocks * block_bytes));
    for (unsigned char& x : cache) x = static_cast<unsigned char>(rng());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> k(static_cast<size_t>(num_tokens * row)), v(k.size());
    std::vector<float> k_f(k.size()), v_f(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      const float magnitude = std::ldexp(1.0f, static_cast<int>(i / head_dim % 11) - 5);
      k[i] = numeric::FloatToBf16(normal(rng) * magnitude);
      v[i] = numeric::FloatToBf16(i / head_dim == 4 ? 0.0f : normal(rng) * magnitude);
      k_f[i] = numeric::Bf16ToFloat(k[i]);
      v_f[i] = numeric::Bf16ToFloat(v[i]);
    }
    std::vector<int64_t> all(static_cast<size_t>(num_blocks * block_size));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<int64_t> gpu_slots(all.begin(), all.begin() + num_tokens);
    gpu_slots[9] = -1;
    gpu_slots[10] = num_blocks * block_size + 1;  // Past the cache: skipped.
    std::vector<int64_t> cpu_slots = gpu_slots;
    cpu_slots[10] = -1;

    std::vector<unsigned char> expected = cache;
    const cpu::PagedKvFp8 cpu_kv =
        cpu::DensePagedKvFp8(expected.data(), block_size, heads, head_dim);
    cpu::AppendKvFp8(cpu_kv, k_f.data(), row, v_f.data(), row, cpu_slots.data(), num_tokens);

    void* d_cache = nullptr;
    void* d_k = nullptr;
    void* d_v = nullptr;
    int64_t* d_slots = nullptr;
    ASSERT_EQ(cudaMalloc(&d_cache, cache.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_k, k.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_v, v.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_slots), gpu_slots.size() * 8), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_cache, cache.data(), cache.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_k, k.data(), k.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_v, v.data(), v.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_slots, gpu_slots.data(), gpu_slots.size() * 8, cudaMemcpyHostToDevice),
              cudaSuccess);
    const PagedKvFp8Gpu kv{.base = d_cache,
                           .num_blocks = num_blocks,
                           .block_size = block_size,
                           .num_kv_heads = heads,
                           .head_dim = head_dim,
                           .block_stride_bytes = cpu_kv.block_stride_bytes,
                           .value_offset_bytes = cpu_kv.value_offset_bytes,
                           .scale_offset_bytes = cpu_kv.scale_offset_bytes};
    ASSERT_THAT(LaunchKvAppendFp8({.kv = kv,
                                   .k = d_k,
                                   .k_stride = row,
                                   .v = d_v,
                                   .v_stride = row,
                                   .slots = d_slots,
                                   .num_tokens = num_tokens},
                                  nullptr),
                IsOk());
    std::vector<unsigned char> got(cache.size());
    ASSERT_EQ(cudaMemcpy(got.data(), d_cache, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(d_cache);
    cudaFree(d_k);
    cudaFree(d_v);
    cudaFree(d_slots);
    int64_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != expected[i] && ++bad <= 5) {
        ADD_FAILURE() << "byte " << i << " (block " << static_cast<int64_t>(i) / block_bytes
                      << ", byte " << static_cast<int64_t>(i) % block_bytes << "): got 0x"
                      << std::hex << int{got[i]} << ", want 0x" << int{expected[i]} << std::dec;
      }
    }
    EXPECT_EQ(bad, 0) << "cache bytes differ from cpu::AppendKvFp8";
  }
}

TEST(KvAppendFp8Test, RejectsBadLayouts) {
  alignas(16) char dummy[64];
  const KvAppendFp8Args good{.kv = {.base = dummy,
                                    .num_blocks = 2,
                                    .block_size = 16,
                                    .num_kv_heads = 2,
                                    .head_dim = 16,
                                    .block_stride_bytes = 1280,
                                    .value_offset_bytes = 512,
                                    .scale_offset_bytes = 1024},
                             .k = dummy,
                             .k_stride = 32,
                             .v = dummy,
                             .v_stride = 32,
                             .slots = reinterpret_cast<const int64_t*>(dummy),
                             .num_tokens = 1};
  KvAppendFp8Args bad = good;
  bad.kv.block_size = 8;
  EXPECT_THAT(LaunchKvAppendFp8(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("block_size 8")));
  bad = good;
  bad.kv.head_dim = 272;
  EXPECT_THAT(LaunchKvAppendFp8(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("head_dim 272")));
  bad = good;
  bad.kv.block_stride_bytes = 1264;
  EXPECT_THAT(LaunchKvAppendFp8(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("scales")));
  bad = good;
  bad.kv.value_offset_bytes = 520;
  EXPECT_THAT(LaunchKvAppendFp8(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("aligned")));
  bad = good;
  bad.k_stride = 31;
  EXPECT_THAT(LaunchKvAppendFp8(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("k_stride")));
}

TEST(KvAppendArgsTest, RejectsBadArguments) {
  alignas(16) char dummy[64];
  const KvAppendArgs good{.kv = {.base = dummy,
                                 .num_blocks = 2,
                                 .block_size = 16,
                                 .num_kv_heads = 2,
                                 .head_dim = 8,
                                 .block_stride_elems = 512,
                                 .value_offset_elems = 256},
                          .k = dummy,
                          .k_stride = 16,
                          .v = dummy,
                          .v_stride = 16,
                          .slots = reinterpret_cast<const int64_t*>(dummy),
                          .num_tokens = 1};
  KvAppendArgs bad = good;
  bad.kv.base = nullptr;
  EXPECT_THAT(LaunchKvAppend(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("base")));
  bad = good;
  bad.kv.num_blocks = 0;
  EXPECT_THAT(LaunchKvAppend(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("num_blocks")));
  bad = good;
  bad.kv.value_offset_elems = 255;
  EXPECT_THAT(LaunchKvAppend(bad, nullptr), StatusIs(absl::StatusCode::kInvalidArgument,
                                                     ::testing::HasSubstr("value_offset_elems")));
  bad = good;
  bad.kv.block_stride_elems = 511;
  EXPECT_THAT(LaunchKvAppend(bad, nullptr), StatusIs(absl::StatusCode::kInvalidArgument,
                                                     ::testing::HasSubstr("block_stride_elems")));
  bad = good;
  bad.v_stride = 15;
  EXPECT_THAT(LaunchKvAppend(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("v_stride")));
  bad = good;
  bad.slots = nullptr;
  EXPECT_THAT(LaunchKvAppend(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("null")));
  bad = good;
  bad.num_tokens = -2;
  EXPECT_THAT(LaunchKvAppend(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("num_tokens")));
}

}  // namespace
}  // namespace trident::kernels::cuda
