#include "kernels/cpu/linear/linear.h"

#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/linear/linear_reference.h"

namespace trident::kernels::cpu {
namespace {

using ::testing::HasSubstr;
using ::trident::numeric::DType;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr uint32_t kSeed = 20261121;

struct Case {
  int64_t m;
  int64_t in_features;
  int64_t out_features;
  DType dtype;
  bool bias;
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "m=" << c.m << " in=" << c.in_features << " out=" << c.out_features << " "
            << numeric::DTypeName(c.dtype) << (c.bias ? " bias" : "");
}

struct Inputs {
  std::vector<float> x;
  std::vector<float> weight_f32;
  std::vector<uint16_t> weight_bf16;
  std::vector<float> bias;
  const void* weight(DType t) const {
    return t == DType::kBF16 ? static_cast<const void*>(weight_bf16.data())
                             : static_cast<const void*>(weight_f32.data());
  }
};

// x ~ N(0, 1), W ~ N(0, 1/in) so that y ~ N(0, 1) whatever the width.
Inputs RandomInputs(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  Inputs in;
  in.x.resize(c.m * c.in_features);
  for (float& v : in.x) v = unit(rng);
  in.weight_f32.resize(c.out_features * c.in_features);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.in_features));
  for (float& v : in.weight_f32) v = unit(rng) * scale;
  in.weight_bf16.resize(in.weight_f32.size());
  numeric::FloatToBf16(in.weight_f32.data(), in.weight_bf16.data(), in.weight_f32.size());
  if (c.bias) {
    in.bias.resize(c.out_features);
    for (float& v : in.bias) v = unit(rng);
  }
  return in;
}

std::vector<float> RoundedToBf16(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = numeric::Bf16ToFloat(numeric::FloatToBf16(x[i]));
  return out;
}

// The x a layer multiplies: rounded to bf16 in plain bf16 compute, as given
// (to ~2^-17) with split activations or in f32.
std::vector<float> XUsed(const Linear& linear, LinearCompute mode, const std::vector<float>& x) {
  return linear.compute_dtype() == DType::kBF16 && mode == LinearCompute::kWeightDtype
             ? RoundedToBf16(x)
             : x;
}

constexpr LinearCompute kModes[] = {LinearCompute::kWeightDtype,
                                    LinearCompute::kBf16SplitActivations};

class LinearTest : public ::testing::TestWithParam<Case> {};

// Against the double reference of what the layer multiplies (its weights, and
// x as XUsed says): only f32 accumulation (and, with split activations,
// ~2^-17 relative) errors remain.
TEST_P(LinearTest, MatchesReferenceOfItsComputeType) {
  for (LinearCompute mode : kModes) {
    const Case c = GetParam();
    SCOPED_TRACE(::testing::Message()
                 << c << " seed " << kSeed << " mode " << static_cast<int>(mode));
    const Inputs in = RandomInputs(c, kSeed);
    absl::StatusOr<std::unique_ptr<Linear>> linear =
        Linear::Create(c.in_features, c.out_features, c.dtype, in.weight(c.dtype),
                       c.bias ? in.bias.data() : nullptr, mode);
    ASSERT_THAT(linear, IsOk());
    std::cout << c << ": computes in " << numeric::DTypeName((*linear)->compute_dtype()) << " with "
              << (*linear)->ImplementationName(c.m) << "\n";
    if (c.dtype == DType::kF32) {
      EXPECT_EQ((*linear)->compute_dtype(), DType::kF32);
    }

    std::vector<float> y(c.m * c.out_features, NAN);
    (*linear)->Forward(in.x.data(), c.m, y.data());
    const std::vector<float> x_used = XUsed(**linear, mode, in.x);
    std::vector<float> want(y.size());
    LinearReference(x_used.data(), c.m, c.in_features, c.out_features, c.dtype, in.weight(c.dtype),
                    c.bias ? in.bias.data() : nullptr, want.data());
    // |y| ~ 1; f32 sums of `in` terms of size ~ 1/sqrt(in) err by ~1e-7 * sqrt(in).
    const float tolerance = 2e-5f;
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_NEAR(y[i], want[i], tolerance) << "element " << i;
    }

    // A second call (cached primitive) gives the same bits.
    std::vector<float> again(y.size(), NAN);
    (*linear)->Forward(in.x.data(), c.m, again.data());
    EXPECT_EQ(again, y);
  }
}

// The stated accuracy of bf16 compute against f32 math on the same (bf16)
// weights: x rounded to bf16 (relative 2^-9) leaves errors of about
// 2^-9 * |y| / sqrt(3) on y ~ N(0, 1), bounded by 1e-2; x split in two bf16
// terms (relative ~2^-17) leaves ~2^-17 * |y|, bounded by 1e-4.
TEST_P(LinearTest, Bf16ComputeStaysWithinStatedToleranceOfF32Math) {
  for (LinearCompute mode : kModes) {
    const Case c = GetParam();
    if (c.dtype != DType::kBF16) GTEST_SKIP() << "f32 weights compute in f32";
    SCOPED_TRACE(::testing::Message()
                 << c << " seed " << kSeed << " mode " << static_cast<int>(mode));
    const Inputs in = RandomInputs(c, kSeed);
    absl::StatusOr<std::unique_ptr<Linear>> linear =
        Linear::Create(c.in_features, c.out_features, c.dtype, in.weight(c.dtype),
                       c.bias ? in.bias.data() : nullptr, mode);
    ASSERT_THAT(linear, IsOk());
    std::vector<float> y(c.m * c.out_features, NAN);
    (*linear)->Forward(in.x.data(), c.m, y.data());
    std::vector<float> want(y.size());
    LinearReference(in.x.data(), c.m, c.in_features, c.out_features, c.dtype, in.weight(c.dtype),
                    c.bias ? in.bias.data() : nullptr, want.data());
    double max_error = 0.0;
    for (size_t i = 0; i < y.size(); ++i) {
      max_error = std::max(max_error, static_cast<double>(std::abs(y[i] - want[i])));
    }
    std::cout << c << " mode " << static_cast<int>(mode) << ": max |y - f32 math| = " << max_error
              << "\n";
    EXPECT_LE(max_error, mode == LinearCompute::kWeightDtype ? 1e-2 : 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearTest,
                         ::testing::Values(Case{1, 64, 32, DType::kF32, false},
                                           Case{1, 4096, 512, DType::kF32, true},
                                           Case{1, 333, 77, DType::kBF16, true},
                                           Case{1, 1024, 4096, DType::kBF16, false},
                                           Case{3, 17, 5, DType::kF32, true},
                                           Case{7, 1000, 301, DType::kBF16, false},
                                           Case{16, 512, 1536, DType::kF32, false},
                                           Case{33, 129, 257, DType::kBF16, true},
                                           Case{130, 256, 384, DType::kF32, true},
                                           Case{200, 768, 96, DType::kBF16, true},
                                           Case{517, 96, 200, DType::kF32, false}));

TEST(LinearTest, ManySizesOfMOnOneLayer) {
  // One layer serves decode (m = batch) and prefill (m = chunk) alike, more
  // distinct m than the primitive cache holds.
  const Case c{0, 96, 80, DType::kBF16, true};
  const Inputs in = RandomInputs(Case{70, c.in_features, c.out_features, c.dtype, c.bias}, kSeed);
  absl::StatusOr<std::unique_ptr<Linear>> linear =
      Linear::Create(c.in_features, c.out_features, c.dtype, in.weight(c.dtype), in.bias.data());
  ASSERT_THAT(linear, IsOk());
  const std::vector<float> x_used = XUsed(**linear, LinearCompute::kWeightDtype, in.x);
  for (int64_t m = 70; m >= 1; --m) {
    std::vector<float> y(m * c.out_features, NAN);
    (*linear)->Forward(in.x.data(), m, y.data());
    std::vector<float> want(y.size());
    LinearReference(x_used.data(), m, c.in_features, c.out_features, c.dtype, in.weight(c.dtype),
                    in.bias.data(), want.data());
    for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], want[i], 2e-5f) << "m " << m;
  }
}

TEST(LinearTest, F32ComputeOfBf16WeightsIsExactF32Math) {
  const Case c{5, 300, 70, DType::kBF16, true};
  const Inputs in = RandomInputs(c, kSeed);
  absl::StatusOr<std::unique_ptr<Linear>> linear =
      Linear::Create(c.in_features, c.out_features, c.dtype, in.weight(c.dtype), in.bias.data(),
                     LinearCompute::kF32);
  ASSERT_THAT(linear, IsOk());
  EXPECT_EQ((*linear)->compute_dtype(), DType::kF32);
  std::vector<float> y(c.m * c.out_features, NAN);
  (*linear)->Forward(in.x.data(), c.m, y.data());
  std::vector<float> want(y.size());
  LinearReference(in.x.data(), c.m, c.in_features, c.out_features, c.dtype, in.weight(c.dtype),
                  in.bias.data(), want.data());
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], want[i], 2e-5f) << "element " << i;
}

TEST(LinearTest, ZeroRowsWritesNothing) {
  const float weight[] = {1.0f, 2.0f};
  absl::StatusOr<std::unique_ptr<Linear>> linear =
      Linear::Create(2, 1, DType::kF32, weight, nullptr);
  ASSERT_THAT(linear, IsOk());
  float y = 7.0f;
  (*linear)->Forward(nullptr, 0, &y);
  EXPECT_EQ(y, 7.0f);
}

TEST(LinearTest, WeightsAreCopiedAtCreate) {
  std::vector<float> weight = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};  // [2][3]
  const float bias[] = {0.5f, -0.5f};
  absl::StatusOr<std::unique_ptr<Linear>> linear =
      Linear::Create(3, 2, DType::kF32, weight.data(), bias);
  ASSERT_THAT(linear, IsOk());
  weight.assign(weight.size(), 100.0f);
  const float x[] = {1.0f, 0.0f, -1.0f};
  float y[2];
  (*linear)->Forward(x, 1, y);
  EXPECT_FLOAT_EQ(y[0], 1.0f - 3.0f + 0.5f);
  EXPECT_FLOAT_EQ(y[1], 4.0f - 6.0f - 0.5f);
  EXPECT_GE((*linear)->packed_weight_bytes(), 6 * sizeof(float));  // Packing may pad.
}

TEST(LinearTest, RejectsBadArguments) {
  const float weight[] = {1.0f};
  EXPECT_THAT(Linear::Create(0, 1, DType::kF32, weight, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("in_features")));
  EXPECT_THAT(Linear::Create(1, -1, DType::kF32, weight, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out_features")));
  EXPECT_THAT(Linear::Create(1, 1, DType::kF32, nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("weight is null")));
  EXPECT_THAT(Linear::Create(1, 1, DType::kF16, weight, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("f16")));
}

}  // namespace
}  // namespace trident::kernels::cpu
