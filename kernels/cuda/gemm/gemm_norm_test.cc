// The RMSNorm fused into Hopper's GEMV (GemmArgs::norm_weight) against the
// norm kernel followed by the plain GEMV: the same bits, for each output
// the GEMV writes, and refused where it does not fuse.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "kernels/cuda/arch/arch.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/rms_norm/rms_norm.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::testing::IsOk;

enum class Mode { kBf16, kF32Accumulate, kSiluMul };

struct NormShape {
  int64_t n, k;
  Mode mode;
};

template <typename T>
T* ToDevice(const std::vector<T>& host) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return d;
}

class GemmNormTest : public ::testing::TestWithParam<NormShape> {};

TEST_P(GemmNormTest, MatchesTheNormKernelThenTheGemv) {
  const NormShape s = GetParam();
  if (!CurrentDeviceIsSm90()) GTEST_SKIP() << "the fused norm is Hopper's GEMV's";
  const uint32_t seed = 5;
  std::printf("n=%lld k=%lld mode=%d seed %u\n", static_cast<long long>(s.n),
              static_cast<long long>(s.k), static_cast<int>(s.mode), seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> residual(s.k), gamma(s.k);
  for (auto& v : residual) v = 3.0f * normal(rng);
  for (auto& v : gamma) v = 1.0f + 0.1f * normal(rng);
  std::vector<uint16_t> w(s.n * s.k);
  for (auto& v : w) v = numeric::FloatToBf16(normal(rng) / 64.0f);
  const bool silu = s.mode == Mode::kSiluMul;
  const bool f32 = s.mode == Mode::kF32Accumulate;
  const int64_t outs = silu ? s.n / 2 : s.n;
  const size_t y_bytes = static_cast<size_t>(outs) * (f32 ? 4 : 2);
  std::vector<char> old(y_bytes);
  for (size_t i = 0; i < old.size(); i += 4) {
    const float v = normal(rng);
    std::memcpy(old.data() + i, &v, std::min<size_t>(4, old.size() - i));
  }
  float* dx = ToDevice(residual);
  float* dg = ToDevice(gamma);
  uint16_t* dw = ToDevice(w);
  uint16_t* dhn = ToDevice(std::vector<uint16_t>(s.k));
  char* dy_plain = ToDevice(old);
  char* dy_fused = ToDevice(old);
  auto gemm = Gemm::Create();
  ASSERT_THAT(gemm.status(), IsOk());
  RmsNormArgs norm;
  norm.x = dx;
  norm.x_dtype = numeric::DType::kF32;
  norm.x_stride = s.k;
  norm.weight = dg;
  norm.out = dhn;
  norm.out_stride = s.k;
  norm.rows = 1;
  norm.dim = s.k;
  norm.eps = 1e-5f;
  ASSERT_THAT(LaunchRmsNorm(norm, nullptr), IsOk());
  GemmArgs plain{dhn, s.k, dw, nullptr, dy_plain, s.n, 1, s.n, s.k};
  plain.y_dtype = f32 ? numeric::DType::kF32 : numeric::DType::kBF16;
  plain.accumulate = f32;
  GemmArgs fused = plain;
  fused.x = dx;
  fused.y = dy_fused;
  fused.norm_weight = dg;
  fused.norm_eps = norm.eps;
  ASSERT_TRUE((*gemm)->FusesNorm(fused));
  if (silu) {
    ASSERT_THAT((*gemm)->RunSiluMul(plain, nullptr), IsOk());
    ASSERT_THAT((*gemm)->RunSiluMul(fused, nullptr), IsOk());
  } else {
    ASSERT_THAT((*gemm)->Run(plain, nullptr), IsOk());
    ASSERT_THAT((*gemm)->Run(fused, nullptr), IsOk());
  }
  std::vector<char> want(y_bytes), got(y_bytes);
  ASSERT_EQ(cudaMemcpy(want.data(), dy_plain, y_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got.data(), dy_fused, y_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t differ = 0;
  for (size_t i = 0; i < y_bytes; ++i) differ += want[i] != got[i];
  EXPECT_EQ(differ, 0) << "bytes of y that differ";
  EXPECT_NE(want, old) << "the GEMV wrote nothing";
  for (void* p :
       {static_cast<void*>(dx), static_cast<void*>(dg), static_cast<void*>(dw),
        static_cast<void*>(dhn), static_cast<void*>(dy_plain), static_cast<void*>(dy_fused)}) {
    cudaFree(p);
  }
}

// The 8B shape's q/k/v (into f32, added to old contents) and gate/up with
// SwiGLU, a row the norm kernel takes with 64 threads (34 vectors), one with
// 256, and 8192 (the 70B shape's hidden size).
INSTANTIATE_TEST_SUITE_P(Shapes, GemmNormTest,
                         ::testing::Values(NormShape{6144, 4096, Mode::kF32Accumulate},
                                           NormShape{28672, 4096, Mode::kSiluMul},
                                           NormShape{100, 136, Mode::kBf16},
                                           NormShape{1000, 1024, Mode::kBf16},
                                           NormShape{2000, 8192, Mode::kF32Accumulate}));

TEST(GemmNormRefusedTest, WhereItDoesNotFuse) {
  auto gemm = Gemm::Create();
  ASSERT_THAT(gemm.status(), IsOk());
  void* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 1 << 20), cudaSuccess);
  const float* weight = static_cast<const float*>(buffer);
  GemmArgs args{buffer, 4096, buffer, nullptr, buffer, 64, 1, 64, 4096};
  args.norm_weight = weight;
  EXPECT_EQ((*gemm)->FusesNorm(args), CurrentDeviceIsSm90());
  // Two rows, a row past the shared memory, a misaligned weight.
  GemmArgs two = args;
  two.m = 2;
  GemmArgs longer = args;
  longer.k = longer.x_stride = 14336;
  GemmArgs misaligned = args;
  misaligned.norm_weight = weight + 1;
  for (const GemmArgs& a : {two, longer, misaligned}) {
    EXPECT_FALSE((*gemm)->FusesNorm(a));
    EXPECT_EQ((*gemm)->Run(a, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  }
  auto plain_gemv = Gemm::Create({.gemv_bulk = false});
  ASSERT_THAT(plain_gemv.status(), IsOk());
  EXPECT_FALSE((*plain_gemv)->FusesNorm(args));
  EXPECT_EQ((*plain_gemv)->Run(args, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  cudaFree(buffer);
}

}  // namespace
}  // namespace trident::kernels::cuda
