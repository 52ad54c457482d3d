#include "common/numeric/fp8.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace trident::numeric {
namespace {

TEST(Fp8E4M3Test, KnownCodes) {
  EXPECT_EQ(Fp8E4M3ToFloat(0x00), 0.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x38), 1.0f);                  // Exponent 7: 2^0.
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.0f);                // 1.75 x 2^8.
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));  // Smallest subnormal.
  EXPECT_EQ(Fp8E4M3ToFloat(0x08), std::ldexp(1.0f, -6));  // Smallest normal.
  EXPECT_EQ(Fp8E4M3ToFloat(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0xff)));
  EXPECT_EQ(FloatToFp8E4M3(1.0f), 0x38);
  EXPECT_EQ(FloatToFp8E4M3(-448.0f), 0xfe);
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.0f, -9)), 0x01);
}

// Every finite code decodes to a value that encodes back to it (negative
// zero included), and the decoded values rise with the codes.
TEST(Fp8E4M3Test, EveryFiniteCodeRoundTrips) {
  float previous = -1.0f;
  for (int code = 0; code < 256; ++code) {
    const uint8_t bits = static_cast<uint8_t>(code);
    const float value = Fp8E4M3ToFloat(bits);
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(value)) << code;
      continue;
    }
    EXPECT_EQ(FloatToFp8E4M3(value), bits) << code << " = " << value;
    if (code < 0x7f) {
      EXPECT_GT(value, previous) << code;
      previous = value;
    }
  }
}

// Halfway between neighbours goes to the even code; just off it, to the
// nearer one. Checked across subnormals and every binade.
TEST(Fp8E4M3Test, RoundsToNearestTiesToEven) {
  for (int code = 0; code < 0x7e; ++code) {
    const float lo = Fp8E4M3ToFloat(static_cast<uint8_t>(code));
    const float hi = Fp8E4M3ToFloat(static_cast<uint8_t>(code + 1));
    const float mid = (lo + hi) / 2;  // Exact: a few bits beyond the format.
    const int even = code % 2 == 0 ? code : code + 1;
    EXPECT_EQ(FloatToFp8E4M3(mid), even) << "between codes " << code << " and " << code + 1;
    EXPECT_EQ(FloatToFp8E4M3(std::nextafter(mid, lo)), code) << code;
    EXPECT_EQ(FloatToFp8E4M3(std::nextafter(mid, hi)), code + 1) << code;
    EXPECT_EQ(FloatToFp8E4M3(-mid), 0x80 | even) << code;
  }
}

TEST(Fp8E4M3Test, SaturatesInsteadOfOverflowing) {
  EXPECT_EQ(FloatToFp8E4M3(449.0f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(1e30f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(FloatToFp8E4M3(std::nanf("")), kFp8E4M3NaN);
  // Below half the smallest subnormal: zero, keeping the sign.
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.0f, -11)), 0x00);
  EXPECT_EQ(FloatToFp8E4M3(-std::ldexp(1.0f, -11)), 0x80);
}

TEST(Fp8E4M3Test, ScaleMapsTheLargestMagnitudeToTheTop) {
  const std::vector<float> values = {0.5f, -3.5f, 1.0f, std::nanf("")};
  const float scale = Fp8E4M3Scale(values);
  EXPECT_FLOAT_EQ(scale, 3.5f / 448.0f);
  EXPECT_EQ(FloatToFp8E4M3(-3.5f / scale), 0xfe);
  EXPECT_EQ(Fp8E4M3Scale({}), 1.0f);
  EXPECT_EQ(Fp8E4M3Scale(std::vector<float>{0.0f, -0.0f}), 1.0f);
  // Relative error of a scaled round trip stays within half a step (2^-4).
  for (float v : {0.5f, -3.5f, 1.0f, 0.013f, 2.2f}) {
    const float back = Fp8E4M3ToFloat(FloatToFp8E4M3(v / scale)) * scale;
    EXPECT_LE(std::fabs(back - v), std::fabs(v) / 16 + std::ldexp(scale, -9)) << v;
  }
}

}  // namespace
}  // namespace trident::numeric
