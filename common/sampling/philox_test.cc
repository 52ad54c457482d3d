#include "common/sampling/philox.h"

#include <cstdint>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::sampling {
namespace {

using ::testing::ElementsAre;

// Known-answer tests from Random123's kat_vectors (philox4x32 10 rounds).
TEST(PhiloxTest, MatchesRandom123KnownAnswerForZeros) {
  EXPECT_THAT(Philox4x32_10({0, 0, 0, 0}, {0, 0}),
              ElementsAre(0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u));
}

TEST(PhiloxTest, MatchesRandom123KnownAnswerForAllOnes) {
  EXPECT_THAT(Philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                            {0xffffffffu, 0xffffffffu}),
              ElementsAre(0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu));
}

TEST(PhiloxTest, MatchesRandom123KnownAnswerForPiDigits) {
  EXPECT_THAT(Philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                            {0xa4093822u, 0x299f31d0u}),
              ElementsAre(0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u));
}

TEST(PhiloxTest, IsUsableAtCompileTime) {
  static_assert(Philox4x32_10({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5u);
  static_assert(PhiloxBits(0, 0) == 0x6627e8d5u);
}

TEST(PhiloxTest, PhiloxBitsMapsSeedToKeyAndCounterToLowWords) {
  const uint64_t seed = 0x0123456789abcdefULL;
  const uint64_t counter = 0xfedcba9876543210ULL;
  EXPECT_EQ(PhiloxBits(seed, counter),
            Philox4x32_10({0x76543210u, 0xfedcba98u, 0, 0}, {0x89abcdefu, 0x01234567u})[0]);
}

TEST(PhiloxTest, UniformIsTopTwentyFourBitsScaled) {
  // 0x6627e8d5 >> 8 = 0x6627e8.
  EXPECT_EQ(UniformFromPhilox(0, 0), static_cast<float>(0x6627e8) / 16777216.0f);
}

TEST(PhiloxTest, UniformStaysInHalfOpenUnitIntervalWithMeanOneHalf) {
  constexpr uint64_t kSeed = 42;
  constexpr int kDraws = 100000;
  double sum = 0;
  for (int i = 0; i < kDraws; ++i) {
    const float u = UniformFromPhilox(kSeed, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  // Standard error of the mean of U(0,1) over 1e5 draws is ~0.0009.
  EXPECT_NEAR(sum / kDraws, 0.5, 0.005) << "seed " << kSeed;
}

TEST(PhiloxTest, DifferentSeedsAndCountersGiveDifferentStreams) {
  EXPECT_NE(PhiloxBits(1, 0), PhiloxBits(2, 0));
  EXPECT_NE(PhiloxBits(1, 0), PhiloxBits(1, 1));
  EXPECT_NE(PhiloxBits(1, 0), PhiloxBits(1, uint64_t{1} << 32));
  EXPECT_NE(PhiloxBits(1, 0), PhiloxBits(1 + (uint64_t{1} << 32), 0));
}

}  // namespace
}  // namespace trident::sampling
