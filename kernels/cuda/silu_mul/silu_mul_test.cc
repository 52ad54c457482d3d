#include "kernels/cuda/silu_mul/silu_mul.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <random>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/silu_mul/silu_mul.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

struct Shape {
  int64_t num_tokens;
  int64_t hidden;
  bool f32_in = false;
};

class SiluMulTest : public ::testing::TestWithParam<Shape> {};

TEST_P(SiluMulTest, MatchesCpuReferenceWithinBf16Tolerance) {
  const Shape shape = GetParam();
  constexpr uint32_t kSeed = 1234;
  std::printf("seed %u, shape (%lld, %lld), %s input\n", kSeed,
              static_cast<long long>(shape.num_tokens), static_cast<long long>(shape.hidden),
              shape.f32_in ? "f32" : "bf16");
  std::mt19937 rng(kSeed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const size_t in_count = static_cast<size_t>(shape.num_tokens * 2 * shape.hidden);
  const size_t out_count = static_cast<size_t>(shape.num_tokens * shape.hidden);
  std::vector<__nv_bfloat16> in_bf16(in_count);
  std::vector<float> in_float(in_count);
  for (size_t i = 0; i < in_count; ++i) {
    const float x = normal(rng);
    in_bf16[i] = __float2bfloat16(x);
    // The reference sees exactly what the kernel reads.
    in_float[i] = shape.f32_in ? x : __bfloat162float(in_bf16[i]);
  }
  std::vector<float> expected(out_count);
  cpu::SiluMulReference(in_float.data(), expected.data(), shape.num_tokens, shape.hidden);

  void* d_in = nullptr;
  void* d_out = nullptr;
  const size_t in_bytes = in_count * (shape.f32_in ? 4 : 2);
  ASSERT_EQ(cudaMalloc(&d_in, in_bytes + 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, out_count * 2 + 2), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const void* host_in = shape.f32_in ? static_cast<const void*>(in_float.data()) : in_bf16.data();
  ASSERT_EQ(cudaMemcpyAsync(d_in, host_in, in_bytes, cudaMemcpyHostToDevice, stream), cudaSuccess);
  ASSERT_THAT(
      LaunchSiluMul({.gate_up = d_in,
                     .gate_up_stride = 2 * shape.hidden,
                     .out = d_out,
                     .out_stride = shape.hidden,
                     .num_tokens = shape.num_tokens,
                     .hidden = shape.hidden,
                     .gate_up_dtype = shape.f32_in ? numeric::DType::kF32 : numeric::DType::kBF16},
                    stream),
      IsOk());
  std::vector<__nv_bfloat16> out(out_count);
  ASSERT_EQ(cudaMemcpyAsync(out.data(), d_out, out_count * 2, cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (size_t i = 0; i < out_count; ++i) {
    const float got = __bfloat162float(out[i]);
    // bf16 keeps 8 bits of mantissa: relative error 2^-8 plus a small floor.
    ASSERT_NEAR(got, expected[i], 1e-2f + 8e-3f * std::abs(expected[i])) << "element " << i;
  }
  cudaStreamDestroy(stream);
  cudaFree(d_in);
  cudaFree(d_out);
}

INSTANTIATE_TEST_SUITE_P(EdgeAndServingShapes, SiluMulTest,
                         ::testing::Values(Shape{0, 4096}, Shape{1, 2}, Shape{3, 4094},
                                           Shape{7, 2050}, Shape{512, 14336}, Shape{1, 2, true},
                                           Shape{5, 2050, true}, Shape{64, 14336, true}));

TEST(SiluMulArgsTest, RejectsBadShapesAndStrides) {
  char dummy[16];
  SiluMulArgs args{.gate_up = dummy,
                   .gate_up_stride = 8,
                   .out = dummy,
                   .out_stride = 4,
                   .num_tokens = 1,
                   .hidden = 4};
  SiluMulArgs odd = args;
  odd.hidden = 3;
  EXPECT_THAT(LaunchSiluMul(odd, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  SiluMulArgs narrow = args;
  narrow.gate_up_stride = 6;
  EXPECT_THAT(LaunchSiluMul(narrow, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
  SiluMulArgs null_out = args;
  null_out.out = nullptr;
  EXPECT_THAT(LaunchSiluMul(null_out, nullptr), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace trident::kernels::cuda
