// What Hopper's GEMV fuses, against the kernels it replaces: the RMSNorm
// ahead of it (GemmArgs::norm_weight) against the norm kernel then the
// plain GEMV, and RoPE in its epilogue (Gemm::RunRope) against the f32
// GEMV then the RoPE kernel. The same bits, and refused where they do not
// fuse.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
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
#include "kernels/cuda/kv_append/kv_append.h"
#include "kernels/cuda/rms_norm/rms_norm.h"
#include "kernels/cuda/rope/rope.h"
#include "kernels/cuda/testing/to_device.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::testing::IsOk;

enum class Mode { kBf16, kF32Accumulate, kSiluMul };

struct NormShape {
  int64_t n, k;
  Mode mode;
};

using ::trident::kernels::cuda::testing::ToDevice;

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

// No KV cache: the fused kernel stores none.
constexpr int64_t kNoCache = -2;

struct RopeShape {
  int32_t q_heads, kv_heads, head_dim;
  int64_t k;
  bool bias;
  bool norm;
  int32_t position;
  // Where k and v are stored in a bf16 paged cache of 4 blocks of 16 tokens
  // (-1: a padding slot, nothing stored), or kNoCache.
  int64_t slot = kNoCache;
};

class GemmRopeTest : public ::testing::TestWithParam<RopeShape> {};

TEST_P(GemmRopeTest, MatchesTheGemvThenTheRopeKernel) {
  const RopeShape s = GetParam();
  if (!CurrentDeviceIsSm90()) GTEST_SKIP() << "the fused RoPE is Hopper's GEMV's";
  const uint32_t seed = 9;
  const int64_t n = int64_t{s.q_heads + 2 * s.kv_heads} * s.head_dim;
  std::printf("heads %d/%d head_dim %d k=%lld bias=%d norm=%d position %d slot %lld seed %u\n",
              s.q_heads, s.kv_heads, s.head_dim, static_cast<long long>(s.k), s.bias, s.norm,
              s.position, static_cast<long long>(s.slot), seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> residual(s.k), gamma(s.k), bias(n), inv_freq(s.head_dim / 2);
  for (auto& v : residual) v = 3.0f * normal(rng);
  for (auto& v : gamma) v = 1.0f + 0.1f * normal(rng);
  for (auto& v : bias) v = normal(rng);
  for (int i = 0; i < s.head_dim / 2; ++i) {
    inv_freq[i] = 1.0f / std::pow(10000.0f, 2.0f * i / s.head_dim);
  }
  std::vector<uint16_t> x(s.k), w(n * s.k);
  for (int64_t i = 0; i < s.k; ++i) x[i] = numeric::FloatToBf16(residual[i]);
  for (auto& v : w) v = numeric::FloatToBf16(normal(rng) / 16.0f);
  void* dx = s.norm ? static_cast<void*>(ToDevice(residual)) : ToDevice(x);
  float* dg = ToDevice(gamma);
  float* db = ToDevice(bias);
  float* dfreq = ToDevice(inv_freq);
  int32_t* dpos = ToDevice(std::vector<int32_t>{s.position});
  uint16_t* dw = ToDevice(w);
  float* dy32 = ToDevice(std::vector<float>(n));
  uint16_t* dwant = ToDevice(std::vector<uint16_t>(n));
  uint16_t* dgot = ToDevice(std::vector<uint16_t>(n, 0xffff));
  // The cache: 4 blocks of K then V, garbage where nothing is stored.
  constexpr int32_t kBlockSize = 16;
  const int64_t kv_elems = int64_t{s.kv_heads} * kBlockSize * s.head_dim;
  std::vector<uint16_t> garbage(4 * 2 * kv_elems);
  for (auto& v : garbage) v = static_cast<uint16_t>(rng());
  uint16_t* dcache_want = ToDevice(garbage);
  uint16_t* dcache_got = ToDevice(garbage);
  int64_t* dslot = ToDevice(std::vector<int64_t>{s.slot});
  auto gemm = Gemm::Create();
  ASSERT_THAT(gemm.status(), IsOk());
  GemmArgs plain{dx, s.k, dw, s.bias ? db : nullptr, dy32, n, 1, n, s.k};
  plain.y_dtype = numeric::DType::kF32;
  if (s.norm) {
    plain.norm_weight = dg;
    plain.norm_eps = 1e-6f;
  }
  ASSERT_THAT((*gemm)->Run(plain, nullptr), IsOk());
  RopeQkvArgs rope_kernel;
  rope_kernel.in = dy32;
  rope_kernel.in_stride = n;
  rope_kernel.out = dwant;
  rope_kernel.out_stride = n;
  rope_kernel.num_q_heads = s.q_heads;
  rope_kernel.num_kv_heads = s.kv_heads;
  rope_kernel.head_dim = s.head_dim;
  rope_kernel.positions = dpos;
  rope_kernel.num_tokens = 1;
  rope_kernel.inv_freq = dfreq;
  ASSERT_THAT(LaunchRopeQkv(rope_kernel, nullptr), IsOk());
  KvAppendArgs append;
  append.kv = {dcache_want, 4, kBlockSize, s.kv_heads, s.head_dim, 2 * kv_elems, kv_elems};
  append.k = dwant + int64_t{s.q_heads} * s.head_dim;
  append.k_stride = n;
  append.v = dwant + int64_t{s.q_heads + s.kv_heads} * s.head_dim;
  append.v_stride = n;
  append.slots = dslot;
  append.num_tokens = s.slot == kNoCache ? 0 : 1;
  ASSERT_THAT(LaunchKvAppend(append, nullptr), IsOk());
  GemmArgs fused = plain;
  fused.y = dgot;
  fused.y_dtype = numeric::DType::kBF16;
  GemmRope rope{dpos, dfreq, s.q_heads, s.kv_heads, s.head_dim};
  if (s.slot != kNoCache) {
    rope.kv = {dcache_got, 4, kBlockSize, s.kv_heads, s.head_dim, 2 * kv_elems, kv_elems};
    rope.slots = dslot;
  }
  ASSERT_TRUE((*gemm)->FusesRope(fused, rope));
  std::vector<uint16_t> want(n), cache_want(garbage.size());
  ASSERT_EQ(cudaMemcpy(want.data(), dwant, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(cache_want.data(), dcache_want, garbage.size() * 2, cudaMemcpyDeviceToHost),
            cudaSuccess);
  // Items handed out as CTAs ask (the default) and in a fixed run per CTA:
  // the same bits.
  for (const bool dynamic : {true, false}) {
    SCOPED_TRACE(dynamic ? "dynamic items" : "static items");
    auto fusing = Gemm::Create({.gemv_dynamic = dynamic});
    ASSERT_THAT(fusing.status(), IsOk());
    ASSERT_EQ(cudaMemcpy(dcache_got, garbage.data(), garbage.size() * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemset(dgot, 0xff, n * 2), cudaSuccess);
    ASSERT_THAT((*fusing)->RunRope(fused, rope, nullptr), IsOk());
    std::vector<uint16_t> got(n), cache_got(garbage.size());
    ASSERT_EQ(cudaMemcpy(got.data(), dgot, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) differ += want[i] != got[i];
    EXPECT_EQ(differ, 0) << "of " << n << " outputs";
    ASSERT_EQ(cudaMemcpy(cache_got.data(), dcache_got, garbage.size() * 2, cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_TRUE(cache_got == cache_want) << "the KV cache differs from LaunchKvAppend's";
    EXPECT_EQ(cache_got == garbage, s.slot < 0) << "stored where it should not, or nothing";
  }
  for (void* p :
       {dx, static_cast<void*>(dg), static_cast<void*>(db), static_cast<void*>(dfreq),
        static_cast<void*>(dpos), static_cast<void*>(dw), static_cast<void*>(dy32),
        static_cast<void*>(dwant), static_cast<void*>(dgot), static_cast<void*>(dcache_want),
        static_cast<void*>(dcache_got), static_cast<void*>(dslot)}) {
    cudaFree(p);
  }
}

// The 8B shape after its fused norm, storing into the cache; a small
// head_dim with a bias; a Qwen-like shape far along (sincosf's long range
// reduction) at a padding slot; head_dim 16 (two items a head), stored.
INSTANTIATE_TEST_SUITE_P(Shapes, GemmRopeTest,
                         ::testing::Values(RopeShape{32, 8, 128, 4096, false, true, 577, 37},
                                           RopeShape{4, 2, 64, 136, true, false, 3},
                                           RopeShape{14, 2, 64, 896, true, true, 100000, -1},
                                           RopeShape{2, 1, 16, 64, false, false, 0, 63}));

TEST(GemmRopeRefusedTest, WhereItDoesNotFuse) {
  auto gemm = Gemm::Create();
  ASSERT_THAT(gemm.status(), IsOk());
  void* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 1 << 20), cudaSuccess);
  const GemmRope rope{static_cast<const int32_t*>(buffer), static_cast<const float*>(buffer), 4, 2,
                      64};
  GemmArgs args{buffer, 256, buffer, nullptr, buffer, 512, 1, 512, 256};
  EXPECT_EQ((*gemm)->FusesRope(args, rope), CurrentDeviceIsSm90());
  GemmArgs two = args;
  two.m = 2;
  GemmArgs wrong_n = args;
  wrong_n.n = wrong_n.y_stride = 448;
  GemmArgs f32 = args;
  f32.y_dtype = numeric::DType::kF32;
  GemmArgs accumulate = args;
  accumulate.accumulate = true;
  for (const GemmArgs& a : {two, wrong_n, f32, accumulate}) {
    EXPECT_FALSE((*gemm)->FusesRope(a, rope));
    EXPECT_EQ((*gemm)->RunRope(a, rope, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  }
  GemmRope odd = rope;
  odd.head_dim = 12;
  odd.num_q_heads = 40;  // n = (40 + 4) x 12 = 528
  GemmArgs odd_args = args;
  odd_args.n = odd_args.y_stride = 528;
  GemmRope no_positions = rope;
  no_positions.positions = nullptr;
  EXPECT_FALSE((*gemm)->FusesRope(odd_args, odd));
  EXPECT_FALSE((*gemm)->FusesRope(args, no_positions));
  EXPECT_EQ((*gemm)->RunRope(args, no_positions, nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
  GemmArgs no_x = args;
  no_x.x = nullptr;
  EXPECT_EQ((*gemm)->RunRope(no_x, rope, nullptr).code(), absl::StatusCode::kInvalidArgument);
  cudaFree(buffer);
}

}  // namespace
}  // namespace trident::kernels::cuda
