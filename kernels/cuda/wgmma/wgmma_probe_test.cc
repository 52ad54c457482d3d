#include "kernels/cuda/wgmma/wgmma_probe.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "kernels/cuda/arch/arch.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

struct Probe {
  std::vector<float> a, b;    // bf16-representable
  std::vector<double> want;   // A B^T (or A B) in double
  std::vector<double> scale;  // sum |a| |b| per element: the rounding bound's scale
};

// With b_rows_k, b is k x 64 (row kk, column n at kk * 64 + n) and want is
// A B; otherwise b is 64 x k and want is A B^T.
Probe MakeProbe(int32_t k, uint32_t seed, bool b_rows_k = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Probe p;
  p.a.resize(64 * k);
  p.b.resize(64 * k);
  for (float& v : p.a) v = numeric::Bf16ToFloat(numeric::FloatToBf16(normal(rng)));
  for (float& v : p.b) v = numeric::Bf16ToFloat(numeric::FloatToBf16(normal(rng)));
  p.want.assign(64 * 64, 0.0);
  p.scale.assign(64 * 64, 0.0);
  for (int m = 0; m < 64; ++m) {
    for (int n = 0; n < 64; ++n) {
      for (int kk = 0; kk < k; ++kk) {
        const float bv = b_rows_k ? p.b[kk * 64 + n] : p.b[n * k + kk];
        p.want[m * 64 + n] += double{p.a[m * k + kk]} * bv;
        p.scale[m * 64 + n] += std::abs(double{p.a[m * k + kk]} * bv);
      }
    }
  }
  return p;
}

// Runs the probe with the given offsets; returns how many of the 4096
// elements are within f32 accumulation error of the product.
int Matching(const Probe& p, int32_t k, uint32_t leading, uint32_t stride, bool register_a = false,
             bool swizzle = false) {
  std::vector<uint16_t> a(p.a.size()), b(p.b.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = numeric::FloatToBf16(p.a[i]);
  for (size_t i = 0; i < b.size(); ++i) b[i] = numeric::FloatToBf16(p.b[i]);
  void *da = nullptr, *db = nullptr, *dd = nullptr;
  EXPECT_EQ(cudaMalloc(&da, a.size() * 2), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&db, b.size() * 2), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&dd, 64 * 64 * 4), cudaSuccess);
  cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(dd, 0xff, 64 * 64 * 4);  // NaN where nothing is written.
  EXPECT_THAT(LaunchWgmmaProbe({static_cast<const uint16_t*>(da), static_cast<const uint16_t*>(db),
                                k, static_cast<float*>(dd), leading, stride, register_a, swizzle},
                               nullptr),
              IsOk());
  std::vector<float> got(64 * 64);
  EXPECT_EQ(cudaMemcpy(got.data(), dd, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dd);
  int matching = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    matching += std::abs(got[i] - p.want[i]) <= 1e-5 * p.scale[i] + 1e-6 ? 1 : 0;
  }
  return matching;
}

// The layout and fragment the header documents: every element of A B^T.
// The swapped offsets are run too and printed, so that a failure says
// whether the two descriptor fields are the other way round.
TEST(WgmmaProbeTest, M64N64ProductsEqualTheCpuProduct) {
  if (!CurrentDeviceIsSm90()) GTEST_SKIP() << "needs an sm_90 device";
  for (int32_t k : {16, 64, 128}) {
    const uint32_t seed = 20261129 + k;
    const Probe p = MakeProbe(k, seed);
    const int documented = Matching(p, k, 128, 256);
    const int swapped = Matching(p, k, 256, 128);
    std::printf("k %d seed %u: %d/4096 match with (leading 128, stride 256), %d/4096 swapped\n", k,
                seed, documented, swapped);
    EXPECT_EQ(documented, 4096) << "k " << k;
  }
}

// P.V's form: A from registers, B MN-major (N contiguous in each 16-byte
// row of a core matrix).
TEST(WgmmaProbeTest, RegisterAWithMnMajorBEqualsTheCpuProduct) {
  if (!CurrentDeviceIsSm90()) GTEST_SKIP() << "needs an sm_90 device";
  for (int32_t k : {16, 64, 128}) {
    const uint32_t seed = 20261130 + k;
    const Probe p = MakeProbe(k, seed, /*b_rows_k=*/true);
    const int documented = Matching(p, k, 128, 256, /*register_a=*/true);
    const int swapped = Matching(p, k, 256, 128, /*register_a=*/true);
    std::printf(
        "register A, k %d seed %u: %d/4096 match with (leading 128, stride 256), %d/4096 "
        "swapped\n",
        k, seed, documented, swapped);
    EXPECT_EQ(documented, 4096) << "k " << k;
  }
}

// The 128-byte-swizzled layouts, K-major (A and B) and MN-major (B with A
// from registers), atoms of 8 rows 1024 bytes apart.
TEST(WgmmaProbeTest, Swizzled128LayoutsEqualTheCpuProduct) {
  if (!CurrentDeviceIsSm90()) GTEST_SKIP() << "needs an sm_90 device";
  for (int32_t k : {16, 64, 128}) {
    const Probe kmajor = MakeProbe(k, 20261131 + k);
    const int a = Matching(kmajor, k, 16, 1024, /*register_a=*/false, /*swizzle=*/true);
    const Probe mnmajor = MakeProbe(k, 20261132 + k, /*b_rows_k=*/true);
    const int b = Matching(mnmajor, k, 16, 1024, /*register_a=*/true, /*swizzle=*/true);
    std::printf("swizzle 128, k %d: K-major %d/4096, MN-major with register A %d/4096 match\n", k,
                a, b);
    EXPECT_EQ(a, 4096) << "k " << k;
    EXPECT_EQ(b, 4096) << "k " << k;
  }
}

TEST(WgmmaProbeTest, BadArgumentsAreRefused) {
  const uint16_t* p = reinterpret_cast<const uint16_t*>(16);
  float* d = reinterpret_cast<float*>(16);
  EXPECT_THAT(LaunchWgmmaProbe({nullptr, p, 16, d}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(LaunchWgmmaProbe({p, p, 24, d}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(LaunchWgmmaProbe({p, p, 256, d}, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace trident::kernels::cuda
