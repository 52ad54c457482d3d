#include "kernels/cpu/silu_mul/silu_mul.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace trident::kernels::cpu {
namespace {

TEST(SiluMulReferenceTest, MatchesTheDefinitionRowByRow) {
  // Two tokens, hidden 3: gate then up in each row.
  const std::vector<float> gate_up = {0.0f, 1.0f, -2.0f, 5.0f, 2.0f, 3.0f,   // token 0
                                      10.0f, -10.0f, 0.5f, 1.0f, 1.0f, -4.0f};  // token 1
  std::vector<float> out(6, -1.0f);
  SiluMulReference(gate_up.data(), out.data(), /*num_tokens=*/2, /*hidden=*/3);
  auto silu = [](float x) { return x / (1.0f + std::exp(-x)); };
  EXPECT_FLOAT_EQ(out[0], 0.0f);  // silu(0) = 0.
  EXPECT_FLOAT_EQ(out[1], silu(1.0f) * 2.0f);
  EXPECT_FLOAT_EQ(out[2], silu(-2.0f) * 3.0f);
  EXPECT_NEAR(out[3], 10.0f, 1e-3f);  // silu(10) ~ 10.
  EXPECT_NEAR(out[4], 0.0f, 1e-3f);   // silu(-10) ~ 0.
  EXPECT_FLOAT_EQ(out[5], silu(0.5f) * -4.0f);
}

TEST(SiluMulReferenceTest, ZeroTokensWritesNothing) {
  float out = 7.0f;
  SiluMulReference(nullptr, &out, /*num_tokens=*/0, /*hidden=*/16);
  EXPECT_EQ(out, 7.0f);
}

}  // namespace
}  // namespace trident::kernels::cpu
