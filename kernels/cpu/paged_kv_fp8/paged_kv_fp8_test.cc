#include "kernels/cpu/paged_kv_fp8/paged_kv_fp8.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "common/numeric/fp8.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::kernels::cpu {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

TEST(PagedKvFp8Test, FragmentPositionsAreAPermutationInQuadOrder) {
  std::set<int32_t> seen;
  for (int32_t i = 0; i < 16; ++i) seen.insert(Fp8FragmentPosition(i));
  EXPECT_EQ(seen.size(), 16u);
  for (int32_t l = 0; l < 4; ++l) {
    EXPECT_EQ(Fp8FragmentPosition(2 * l), 4 * l);
    EXPECT_EQ(Fp8FragmentPosition(2 * l + 1), 4 * l + 1);
    EXPECT_EQ(Fp8FragmentPosition(2 * l + 8), 4 * l + 2);
    EXPECT_EQ(Fp8FragmentPosition(2 * l + 9), 4 * l + 3);
  }
}

TEST(PagedKvFp8Test, ValidationNamesTheField) {
  alignas(16) static unsigned char buffer[16];
  PagedKvFp8 kv = DensePagedKvFp8(buffer, 16, 2, 64);
  EXPECT_THAT(ValidatePagedKvFp8(kv), IsOk());
  PagedKvFp8 bad = kv;
  bad.block_size = 8;
  EXPECT_THAT(ValidatePagedKvFp8(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_size 8")));
  bad = kv;
  bad.head_dim = 72;
  EXPECT_THAT(ValidatePagedKvFp8(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("head_dim 72")));
  bad = kv;
  bad.scale_offset_bytes = kv.value_offset_bytes;
  EXPECT_THAT(ValidatePagedKvFp8(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("overlap")));
  bad = kv;
  bad.block_stride_bytes -= 16;
  EXPECT_THAT(ValidatePagedKvFp8(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                                HasSubstr("does not hold")));
  bad = kv;
  bad.base = nullptr;
  EXPECT_THAT(ValidatePagedKvFp8(bad), StatusIs(absl::StatusCode::kInvalidArgument));
}

// Every stored element is the nearest E4M3 value of x / scale, the scale is
// the row's amax / 448, and the read gives back x within half an E4M3 step.
TEST(PagedKvFp8Test, AppendThenReadRoundTripsEveryRowWithinItsScale) {
  const uint32_t seed = 20261128;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (int32_t head_dim : {16, 64, 80, 128, 256}) {
    const int32_t heads = 3;
    const int32_t block_size = 32;
    const int32_t blocks = 4;
    const int32_t tokens = 40;
    std::vector<unsigned char> pool(
        static_cast<size_t>(Fp8BlockBytes(block_size, heads, head_dim) * blocks + 16));
    void* base = pool.data() + (16 - reinterpret_cast<uintptr_t>(pool.data()) % 16) % 16;
    const PagedKvFp8 kv = DensePagedKvFp8(base, block_size, heads, head_dim);
    ASSERT_THAT(ValidatePagedKvFp8(kv), IsOk());
    const int64_t row = static_cast<int64_t>(heads) * head_dim;
    std::vector<float> k(static_cast<size_t>(tokens * row)), v(k.size());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t i = 0; i < k.size(); ++i) {
      // Rows of very different magnitudes, and an all-zero one.
      const float magnitude = std::ldexp(1.0f, static_cast<int>(i / head_dim % 9) - 4);
      k[i] = normal(rng) * magnitude;
      v[i] = i / head_dim == 5 ? 0.0f : normal(rng) * magnitude;
    }
    std::vector<int64_t> slots(tokens);
    std::vector<int64_t> all(blocks * block_size);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    std::shuffle(all.begin(), all.end(), rng);
    for (int32_t t = 0; t < tokens; ++t) slots[t] = t == 7 ? -1 : all[t];
    AppendKvFp8(kv, k.data(), row, v.data(), row, slots.data(), tokens);

    std::vector<float> got_k(head_dim), got_v(head_dim);
    for (int32_t t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;
      for (int32_t h = 0; h < heads; ++h) {
        ReadKvFp8(kv, slots[t] / block_size, static_cast<int32_t>(slots[t] % block_size), h,
                  got_k.data(), got_v.data());
        const float* want_k = &k[t * row + h * head_dim];
        const float* want_v = &v[t * row + h * head_dim];
        const float k_scale = numeric::Fp8E4M3Scale({want_k, static_cast<size_t>(head_dim)});
        const float v_scale = numeric::Fp8E4M3Scale({want_v, static_cast<size_t>(head_dim)});
        for (int32_t d = 0; d < head_dim; ++d) {
          EXPECT_EQ(got_k[d],
                    numeric::Fp8E4M3ToFloat(numeric::FloatToFp8E4M3(want_k[d] / k_scale)) *
                        k_scale)
              << "head_dim " << head_dim << " token " << t << " head " << h << " dim " << d;
          // Relative error of E4M3: at most 2^-4 of the value, or half the
          // subnormal step (2^-10) of the scale.
          EXPECT_LE(std::fabs(got_v[d] - want_v[d]),
                    std::fmax(std::fabs(want_v[d]) / 16, v_scale / 1024) * 1.0001f);
        }
      }
    }
  }
}

}  // namespace
}  // namespace trident::kernels::cpu
