#include "kernels/cuda/rope/rope.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/rope/rope.h"
#include "kernels/cuda/kv_append/kv_append.h"
#include "kernels/cuda/testing/to_device.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::kernels::cuda::testing::ToDevice;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

struct Case {
  int32_t head_dim;
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int64_t num_tokens;
  int64_t row_pad;  // Extra elements per fused row (odd: forces the scalar path).
  bool llama3;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "head_dim " << c.head_dim << ", heads " << c.num_q_heads << "/" << c.num_kv_heads
      << ", tokens " << c.num_tokens << ", row pad " << c.row_pad
      << (c.llama3 ? ", llama3" : ", default");
}

class RopeTest : public ::testing::TestWithParam<Case> {};

TEST_P(RopeTest, MatchesCpuApplyRopeOnBf16Inputs) {
  const Case c = GetParam();
  constexpr uint32_t kSeed = 777;
  std::printf("seed %u\n", kSeed);
  std::mt19937 rng(kSeed);
  cpu::RopeConfig config;
  config.head_dim = c.head_dim;
  config.theta = c.llama3 ? 500000.0 : 10000.0;
  config.llama3_scaling = c.llama3;
  ASSERT_TRUE(cpu::ValidateRopeConfig(config).ok());
  const std::vector<float> inv_freq = cpu::RopeInvFreq(config);

  const int64_t q_width = static_cast<int64_t>(c.num_q_heads) * c.head_dim;
  const int64_t kv_width = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const int64_t width = q_width + 2 * kv_width + c.row_pad;
  const size_t n = static_cast<size_t>(c.num_tokens * width);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<uint16_t> bits(n);
  std::vector<float> widened(n);
  for (size_t i = 0; i < n; ++i) {
    bits[i] = numeric::FloatToBf16(normal(rng));
    widened[i] = numeric::Bf16ToFloat(bits[i]);
  }
  std::vector<int32_t> positions(c.num_tokens);
  std::uniform_int_distribution<int32_t> pos_dist(0, 131072);
  for (int32_t& p : positions) p = pos_dist(rng);
  const int32_t edges[] = {0, 131072, 1, 131071, 8191, 8192};
  for (size_t j = 0; j < 6 && j < positions.size(); ++j) positions[j] = edges[j];

  std::vector<float> expected = widened;
  cpu::ApplyRope(expected.data(), width, c.num_q_heads, expected.data() + q_width, width,
                 c.num_kv_heads, c.head_dim, positions.data(), c.num_tokens, inv_freq.data());

  uint16_t* d_qkv = nullptr;
  int32_t* d_positions = nullptr;
  float* d_inv_freq = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_qkv), n * 2 + 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_positions), positions.size() * 4 + 4),
            cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_inv_freq), inv_freq.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_qkv, bits.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_positions, positions.data(), positions.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_inv_freq, inv_freq.data(), inv_freq.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_THAT(LaunchRope({.q = d_qkv,
                          .q_token_stride = width,
                          .num_q_heads = c.num_q_heads,
                          .k = c.num_kv_heads > 0 ? d_qkv + q_width : nullptr,
                          .k_token_stride = width,
                          .num_kv_heads = c.num_kv_heads,
                          .head_dim = c.head_dim,
                          .positions = d_positions,
                          .num_tokens = c.num_tokens,
                          .inv_freq = d_inv_freq},
                         nullptr),
              IsOk());
  std::vector<uint16_t> got(n);
  ASSERT_EQ(cudaMemcpy(got.data(), d_qkv, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d_qkv);
  cudaFree(d_positions);
  cudaFree(d_inv_freq);

  // Tolerance: bf16 rounding of the result (half an ulp: 2^-8 relative) plus
  // the fp32 differences of sincosf (CUDA: within 2 ulp) and std::sin/cos,
  // which scale with the pair's magnitude: 2^-20 * (|a| + |b|).
  const int32_t half = c.head_dim / 2;
  int64_t bad = 0;
  for (int64_t t = 0; t < c.num_tokens; ++t) {
    for (int64_t e = 0; e < width; ++e) {
      const size_t idx = static_cast<size_t>(t * width + e);
      if (e >= q_width + kv_width) {
        ASSERT_EQ(got[idx], bits[idx]) << "v or padding changed: token " << t << " element " << e;
        continue;
      }
      const int64_t in_head = e % c.head_dim;
      const int64_t partner = in_head < half ? idx + half : idx - half;
      const float magnitude = std::abs(widened[idx]) + std::abs(widened[partner]);
      const float want = expected[idx];
      const float tolerance = std::abs(want) / 256.0f + magnitude / (1 << 20);
      const float g = numeric::Bf16ToFloat(got[idx]);
      if (!(std::abs(g - want) <= tolerance) && ++bad <= 5) {
        ADD_FAILURE() << "token " << t << " (position " << positions[t] << "), "
                      << (e < q_width ? "q" : "k") << " element " << e << ": got " << g << ", want "
                      << want << " +- " << tolerance;
      }
    }
  }
  EXPECT_EQ(bad, 0) << "elements out of tolerance";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RopeTest,
    ::testing::Values(Case{64, 4, 1, 1, 0, false},     // One decode token, GQA 4:1.
                      Case{64, 8, 8, 7, 0, false},     // MHA.
                      Case{128, 32, 8, 300, 0, true},  // Llama-3-8B, prefill.
                      Case{128, 40, 8, 3, 1, true},    // Odd row stride: scalar path.
                      Case{128, 4, 0, 2, 0, true},     // q only.
                      Case{6, 2, 1, 9, 0, false}));    // head_dim % 4 != 0: scalar path.

// The fp32-in, bf16-out fused form: every value rounded once, after the
// rotation; v heads only rounded.
TEST_P(RopeTest, QkvF32MatchesCpuApplyRope) {
  const Case c = GetParam();
  if (c.num_kv_heads == 0) GTEST_SKIP() << "fused rows always carry k and v";
  constexpr uint32_t kSeed = 778;
  std::printf("seed %u\n", kSeed);
  std::mt19937 rng(kSeed);
  cpu::RopeConfig config;
  config.head_dim = c.head_dim;
  config.theta = c.llama3 ? 500000.0 : 10000.0;
  config.llama3_scaling = c.llama3;
  const std::vector<float> inv_freq = cpu::RopeInvFreq(config);
  const int64_t q_width = static_cast<int64_t>(c.num_q_heads) * c.head_dim;
  const int64_t kv_width = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const int64_t width = q_width + 2 * kv_width;
  const int64_t in_stride = width + c.row_pad;
  const int64_t out_stride = width + 2 * c.row_pad;
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> in(static_cast<size_t>(c.num_tokens * in_stride));
  for (float& x : in) x = normal(rng);
  std::vector<int32_t> positions(c.num_tokens);
  std::uniform_int_distribution<int32_t> pos_dist(0, 131072);
  for (int32_t& p : positions) p = pos_dist(rng);
  if (!positions.empty()) positions[0] = 0;
  std::vector<float> expected = in;
  cpu::ApplyRope(expected.data(), in_stride, c.num_q_heads, expected.data() + q_width, in_stride,
                 c.num_kv_heads, c.head_dim, positions.data(), c.num_tokens, inv_freq.data());

  float* d_in = nullptr;
  uint16_t* d_out = nullptr;
  int32_t* d_positions = nullptr;
  float* d_inv_freq = nullptr;
  const size_t out_count = static_cast<size_t>(c.num_tokens * out_stride);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_in), in.size() * 4 + 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_out), out_count * 2 + 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_positions), positions.size() * 4 + 4),
            cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_inv_freq), inv_freq.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_out, 0xff, out_count * 2), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_in, in.data(), in.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_positions, positions.data(), positions.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_inv_freq, inv_freq.data(), inv_freq.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_THAT(LaunchRopeQkv({.in = d_in,
                             .in_stride = in_stride,
                             .out = d_out,
                             .out_stride = out_stride,
                             .num_q_heads = c.num_q_heads,
                             .num_kv_heads = c.num_kv_heads,
                             .head_dim = c.head_dim,
                             .positions = d_positions,
                             .num_tokens = c.num_tokens,
                             .inv_freq = d_inv_freq},
                            nullptr),
              IsOk());
  std::vector<uint16_t> got(out_count);
  ASSERT_EQ(cudaMemcpy(got.data(), d_out, out_count * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d_in);
  cudaFree(d_out);
  cudaFree(d_positions);
  cudaFree(d_inv_freq);
  const int32_t half = c.head_dim / 2;
  int64_t bad = 0;
  for (int64_t t = 0; t < c.num_tokens; ++t) {
    for (int64_t e = 0; e < out_stride; ++e) {
      const uint16_t g = got[static_cast<size_t>(t * out_stride + e)];
      if (e >= width) {
        ASSERT_EQ(g, 0xffff) << "padding written: token " << t << " element " << e;
        continue;
      }
      const size_t idx = static_cast<size_t>(t * in_stride + e);
      if (e >= q_width + kv_width) {
        ASSERT_EQ(g, numeric::FloatToBf16(in[idx])) << "v: token " << t << " element " << e;
        continue;
      }
      const int64_t in_head = e % c.head_dim;
      const size_t partner = in_head < half ? idx + half : idx - half;
      const float magnitude = std::abs(in[idx]) + std::abs(in[partner]);
      const float want = expected[idx];
      // Half a bf16 ulp of the result plus sincosf's fp32 differences.
      const float tolerance = std::abs(want) / 256.0f + magnitude / (1 << 20);
      const float value = numeric::Bf16ToFloat(g);
      if (!(std::abs(value - want) <= tolerance) && ++bad <= 5) {
        ADD_FAILURE() << "token " << t << ", element " << e << ": got " << value << ", want "
                      << want << " +- " << tolerance;
      }
    }
  }
  EXPECT_EQ(bad, 0) << "elements out of tolerance";
}

// With a KV cache, LaunchRopeQkv stores each token's k and v where the KV
// append stores them, from the rows it writes: the same bytes as the
// kernel then LaunchKvAppend, padding and out-of-cache slots untouched.
TEST(RopeQkvTest, StoresKAndVAsTheAppend) {
  constexpr int32_t kQHeads = 6, kKvHeads = 2, kHeadDim = 64, kBlockSize = 16, kBlocks = 5;
  constexpr int64_t kTokens = 37;
  const uint32_t seed = 23;
  std::printf("tokens %lld heads %d/%d head_dim %d seed %u\n", static_cast<long long>(kTokens),
              kQHeads, kKvHeads, kHeadDim, seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t width = int64_t{kQHeads + 2 * kKvHeads} * kHeadDim;
  std::vector<float> in(kTokens * width);
  for (float& x : in) x = normal(rng);
  std::vector<int32_t> positions(kTokens);
  std::vector<int64_t> slots(kTokens);
  for (int64_t t = 0; t < kTokens; ++t) {
    positions[t] = static_cast<int32_t>(3 * t + 1);
    slots[t] = (t * 7) % (kBlocks * kBlockSize);  // distinct: 7 and 80 are coprime
  }
  slots[5] = -1;                    // padding
  slots[9] = kBlocks * kBlockSize;  // past the cache
  std::vector<float> inv_freq(kHeadDim / 2);
  for (int i = 0; i < kHeadDim / 2; ++i) {
    inv_freq[i] = 1.0f / std::pow(10000.0f, 2.0f * i / kHeadDim);
  }
  const int64_t kv_elems = int64_t{kKvHeads} * kBlockSize * kHeadDim;
  const size_t cache_count = static_cast<size_t>(kBlocks * 2 * kv_elems);
  std::vector<uint16_t> garbage(cache_count);
  for (uint16_t& g : garbage) g = static_cast<uint16_t>(rng());
  float* d_in = ToDevice(in);
  int32_t* d_positions = ToDevice(positions);
  int64_t* d_slots = ToDevice(slots);
  float* d_inv_freq = ToDevice(inv_freq);
  uint16_t* d_out_want = ToDevice(std::vector<uint16_t>(kTokens * width));
  uint16_t* d_out_got = ToDevice(std::vector<uint16_t>(kTokens * width));
  uint16_t* d_cache_want = ToDevice(garbage);
  uint16_t* d_cache_got = ToDevice(garbage);
  RopeQkvArgs rope{.in = d_in,
                   .in_stride = width,
                   .out = d_out_want,
                   .out_stride = width,
                   .num_q_heads = kQHeads,
                   .num_kv_heads = kKvHeads,
                   .head_dim = kHeadDim,
                   .positions = d_positions,
                   .num_tokens = kTokens,
                   .inv_freq = d_inv_freq};
  ASSERT_THAT(LaunchRopeQkv(rope, nullptr), IsOk());
  KvAppendArgs append;
  append.kv = {d_cache_want, kBlocks, kBlockSize, kKvHeads, kHeadDim, 2 * kv_elems, kv_elems};
  append.k = d_out_want + int64_t{kQHeads} * kHeadDim;
  append.k_stride = width;
  append.v = d_out_want + int64_t{kQHeads + kKvHeads} * kHeadDim;
  append.v_stride = width;
  append.slots = d_slots;
  append.num_tokens = kTokens;
  ASSERT_THAT(LaunchKvAppend(append, nullptr), IsOk());
  rope.out = d_out_got;
  rope.kv = append.kv;
  rope.kv.base = d_cache_got;
  rope.slots = d_slots;
  ASSERT_THAT(LaunchRopeQkv(rope, nullptr), IsOk());
  auto to_host = [](const void* d, size_t count) {
    std::vector<uint16_t> h(count);
    EXPECT_EQ(cudaMemcpy(h.data(), d, count * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  };
  EXPECT_EQ(to_host(d_out_got, kTokens * width), to_host(d_out_want, kTokens * width));
  const std::vector<uint16_t> cache_want = to_host(d_cache_want, cache_count);
  EXPECT_EQ(to_host(d_cache_got, cache_count), cache_want) << "the cache differs from the append's";
  EXPECT_NE(cache_want, garbage) << "the append stored nothing";
  for (void* p : {static_cast<void*>(d_in), static_cast<void*>(d_positions),
                  static_cast<void*>(d_slots), static_cast<void*>(d_inv_freq),
                  static_cast<void*>(d_out_want), static_cast<void*>(d_out_got),
                  static_cast<void*>(d_cache_want), static_cast<void*>(d_cache_got)}) {
    cudaFree(p);
  }
}

TEST(RopeArgsTest, QkvRejectsBadArguments) {
  alignas(16) char dummy[256];
  const RopeQkvArgs good{.in = reinterpret_cast<const float*>(dummy),
                         .in_stride = 32,
                         .out = dummy,
                         .out_stride = 32,
                         .num_q_heads = 2,
                         .num_kv_heads = 1,
                         .head_dim = 8,
                         .positions = reinterpret_cast<const int32_t*>(dummy),
                         .num_tokens = 1,
                         .inv_freq = reinterpret_cast<const float*>(dummy)};
  RopeQkvArgs bad = good;
  bad.head_dim = 3;
  EXPECT_THAT(LaunchRopeQkv(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("head_dim")));
  bad = good;
  bad.in_stride = 31;
  EXPECT_THAT(LaunchRopeQkv(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("in_stride")));
  bad = good;
  bad.out = nullptr;
  EXPECT_THAT(LaunchRopeQkv(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("null")));
  const PagedKvBf16 cache{dummy, 1, 4, 1, 8, 256, 128};
  bad = good;
  bad.kv = cache;  // no slots
  EXPECT_THAT(LaunchRopeQkv(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("slots")));
  bad.slots = reinterpret_cast<const int64_t*>(dummy);
  bad.kv.num_kv_heads = 2;  // not the step's
  EXPECT_THAT(LaunchRopeQkv(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("heads")));
  bad.kv = cache;
  bad.kv.value_offset_elems = 8;  // V over K
  EXPECT_THAT(LaunchRopeQkv(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("KV cache")));
}

TEST(RopeArgsTest, RejectsBadArguments) {
  alignas(16) char dummy[256];
  const RopeArgs good{.q = dummy,
                      .q_token_stride = 24,
                      .num_q_heads = 2,
                      .k = dummy + 32,
                      .k_token_stride = 24,
                      .num_kv_heads = 1,
                      .head_dim = 8,
                      .positions = reinterpret_cast<const int32_t*>(dummy),
                      .num_tokens = 1,
                      .inv_freq = reinterpret_cast<const float*>(dummy)};
  RopeArgs bad = good;
  bad.head_dim = 7;
  EXPECT_THAT(LaunchRope(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("head_dim")));
  bad = good;
  bad.q_token_stride = 15;
  EXPECT_THAT(LaunchRope(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("q_token_stride")));
  bad = good;
  bad.k_token_stride = 7;
  EXPECT_THAT(LaunchRope(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("k_token_stride")));
  bad = good;
  bad.k = dummy + 16;  // Overlaps q's second head.
  EXPECT_THAT(LaunchRope(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("overlap")));
  bad = good;
  bad.positions = nullptr;
  EXPECT_THAT(LaunchRope(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("null")));
  bad = good;
  bad.num_tokens = -1;
  EXPECT_THAT(LaunchRope(bad, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("num_tokens")));
}

}  // namespace
}  // namespace trident::kernels::cuda
