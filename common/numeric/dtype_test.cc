#include "common/numeric/dtype.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace trident::numeric {
namespace {

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down).
  EXPECT_EQ(FloatToBf16(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 is halfway with an odd lower neighbour: rounds up.
  EXPECT_EQ(FloatToBf16(1.01171875f), 0x3f82);
  EXPECT_EQ(Bf16ToFloat(0xc040), -3.0f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::infinity()))));
}

TEST(DTypeTest, HalfRoundTripsEveryFiniteValue) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = HalfToFloat(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << "bits=" << bits;
  }
}

TEST(DTypeTest, HalfKnownValues) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);                      // overflows to inf
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
}

TEST(DTypeTest, BulkConversions) {
  const float src[4] = {0.5f, -2.0f, 3.25f, 1e-3f};
  uint16_t bf[4];
  FloatToBf16(src, bf, 4);
  float back[4];
  ToFloat(DType::kBF16, bf, back, 4);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(back[i], src[i], std::fabs(src[i]) / 128);
  uint16_t copy[4];
  ToBf16(DType::kBF16, bf, copy, 4);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(copy[i], bf[i]);
  EXPECT_EQ(ElementSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
}

TEST(DTypeTest, BulkBf16ConversionsAgreeWithTheScalarOnesBitForBit) {
  // Random bit patterns (NaNs, infinities, subnormals and ties included),
  // at a length that leaves a vector loop's remainder.
  std::mt19937 rng(5);
  std::printf("seed 5\n");
  std::vector<uint32_t> bits(4099);
  for (uint32_t& b : bits) b = rng();
  bits[0] = 0x7fc00000u;  // quiet NaN
  bits[1] = 0xff800001u;  // signalling NaN
  bits[2] = 0x7f800000u;  // inf
  bits[3] = 0x3f808000u;  // a tie, rounds to even
  bits[4] = 0x00000001u;  // the smallest subnormal
  std::vector<float> f(bits.size());
  std::memcpy(f.data(), bits.data(), bits.size() * sizeof(float));
  std::vector<uint16_t> bf(bits.size());
  FloatToBf16(f.data(), bf.data(), f.size());
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(bf[i], FloatToBf16(f[i])) << i;
  std::vector<float> back(bits.size());
  Bf16ToFloat(bf.data(), back.data(), bf.size());
  for (size_t i = 0; i < bf.size(); ++i) {
    const float want = Bf16ToFloat(bf[i]);
    ASSERT_EQ(std::memcmp(&back[i], &want, sizeof(float)), 0) << i;
  }
}

}  // namespace
}  // namespace trident::numeric
