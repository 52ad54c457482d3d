#include "kernels/cpu/rms_norm/rms_norm.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/rms_norm/rms_norm_reference.h"

namespace trident::kernels::cpu {
namespace {

constexpr uint32_t kSeed = 1234;

struct Shape {
  int64_t rows;
  int64_t dim;
};

std::vector<float> RandomVector(int64_t n, float mean, float stddev, std::mt19937* rng) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(*rng);
  return v;
}

// fp32 against double: the sum of squares of a few thousand terms and two
// roundings. Vectorized (-O2) the sum keeps well inside 2e-6 relative; summed
// in order (the -O1 sanitizer builds) it reaches ~2e-6 at hidden 4096, about
// sqrt(n) roundings: 1e-5 holds for both, and a wrong weight or element is
// off by orders more.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5f * std::abs(want[i]) + 1e-7f) << "element " << i;
  }
}

class RmsNormTest : public ::testing::TestWithParam<Shape> {};

TEST_P(RmsNormTest, MatchesReference) {
  const Shape shape = GetParam();
  SCOPED_TRACE(::testing::Message()
               << "seed " << kSeed << ", rows " << shape.rows << ", dim " << shape.dim);
  std::mt19937 rng(kSeed);
  const std::vector<float> x = RandomVector(shape.rows * shape.dim, 0.1f, 2.0f, &rng);
  const std::vector<float> weight = RandomVector(shape.dim, 1.0f, 0.3f, &rng);
  std::vector<float> out(x.size(), NAN);
  std::vector<float> want(x.size(), NAN);
  RmsNorm(x.data(), weight.data(), shape.rows, shape.dim, 1e-5f, out.data());
  RmsNormReference(x.data(), weight.data(), shape.rows, shape.dim, 1e-5f, want.data());
  ExpectClose(out, want);

  // In place gives the same bits.
  std::vector<float> in_place = x;
  RmsNorm(in_place.data(), weight.data(), shape.rows, shape.dim, 1e-5f, in_place.data());
  EXPECT_EQ(in_place, out);
}

TEST_P(RmsNormTest, AddRmsNormMatchesReferenceAndUpdatesResidual) {
  const Shape shape = GetParam();
  SCOPED_TRACE(::testing::Message()
               << "seed " << kSeed << ", rows " << shape.rows << ", dim " << shape.dim);
  std::mt19937 rng(kSeed + 1);
  const std::vector<float> hidden = RandomVector(shape.rows * shape.dim, 0.0f, 1.0f, &rng);
  const std::vector<float> delta = RandomVector(shape.rows * shape.dim, 0.0f, 0.5f, &rng);
  const std::vector<float> weight = RandomVector(shape.dim, 1.0f, 0.3f, &rng);
  std::vector<float> residual = hidden;
  std::vector<float> out(hidden.size(), NAN);
  AddRmsNorm(residual.data(), delta.data(), weight.data(), shape.rows, shape.dim, 1e-6f,
             out.data());
  std::vector<float> want_residual = hidden;
  std::vector<float> want(hidden.size(), NAN);
  AddRmsNormReference(want_residual.data(), delta.data(), weight.data(), shape.rows, shape.dim,
                      1e-6f, want.data());
  EXPECT_EQ(residual, want_residual);  // One fp32 add per element either way.
  ExpectClose(out, want);
}

INSTANTIATE_TEST_SUITE_P(EdgeAndModelShapes, RmsNormTest,
                         ::testing::Values(Shape{0, 4096}, Shape{1, 1}, Shape{1, 8}, Shape{3, 4095},
                                           Shape{17, 2048}, Shape{64, 5120}));

TEST(RmsNormTest, MatchesHandComputedValues) {
  // mean(3^2, 4^2) = 12.5; rsqrt(12.5) = 0.28284271.
  const float x[] = {3.0f, 4.0f};
  const float weight[] = {1.0f, 2.0f};
  float out[2];
  RmsNorm(x, weight, /*rows=*/1, /*dim=*/2, /*eps=*/0.0f, out);
  EXPECT_FLOAT_EQ(out[0], 3.0f * 0.28284271f);
  EXPECT_FLOAT_EQ(out[1], 2.0f * 4.0f * 0.28284271f);
}

TEST(RmsNormTest, EpsKeepsAZeroRowFinite) {
  const float x[] = {0.0f, 0.0f, 0.0f};
  const float weight[] = {1.0f, 1.0f, 1.0f};
  float out[3] = {NAN, NAN, NAN};
  RmsNorm(x, weight, /*rows=*/1, /*dim=*/3, /*eps=*/1e-6f, out);
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(RmsNormTest, ZeroRowsWritesNothing) {
  float out = 7.0f;
  float residual = 5.0f;
  RmsNorm(nullptr, nullptr, /*rows=*/0, /*dim=*/16, 1e-5f, &out);
  AddRmsNorm(&residual, nullptr, nullptr, /*rows=*/0, /*dim=*/16, 1e-5f, &out);
  EXPECT_EQ(out, 7.0f);
  EXPECT_EQ(residual, 5.0f);
}

}  // namespace
}  // namespace trident::kernels::cpu
