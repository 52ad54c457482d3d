#include "kernels/cuda/gemm/gemm.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "kernels/cpu/linear/linear_reference.h"
#include "kernels/cuda/arch/arch.h"
#include "kernels/cuda/testing/device_timer.h"
#include "kernels/cuda/testing/to_device.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::testing::IsOk;

struct Shape {
  int64_t m, n, k;
  bool bias;
  int64_t x_pad = 0;  // extra elements per x row (stride > k)
  bool f32_out = false;
  bool accumulate = false;  // y += x·Wᵀ over random old contents
};

using ::trident::kernels::cuda::testing::ToDevice;

// Which kernels may take a call: cuBLASLt alone, the register-streaming
// GEMV for the single-row calls that suit it, Hopper's GEMV (on sm_90;
// elsewhere the same as the register GEMV), and with it Hopper's skinny
// GEMM for 2-64 rows, in tiles of 128 W rows or of 64, and in clusters
// that split a tile's k where the tiles fit one wave (elsewhere cuBLASLt);
// and cuBLASLt alone with its candidates timed, called inside a CUDA graph
// capture (where tuning happens) and then replayed.
enum Path {
  kCublas = 0,
  kGemv = 1,
  kGemvBulk = 2,
  kSkinny = 3,
  kSkinnyTile64 = 4,
  kSkinnyCluster = 5,
  kGemvBulkStatic = 6,  // Hopper's GEMV with a fixed run of items per CTA
  kCublasTuned = 7,
};

GemmOptions OptionsFor(int path) {
  if (path == kCublasTuned) return {.gemv = false, .tune_algos = 16};
  return {.gemv = path != kCublas,
          .gemv_bulk = path >= kGemvBulk,
          .gemv_dynamic = path != kGemvBulkStatic,
          .skinny = path >= kSkinny && path != kGemvBulkStatic,
          .skinny_tile_rows = path == kSkinnyTile64 ? 64 : 128,
          .skinny_cluster_split = path == kSkinnyCluster};
}

// Enqueues `args` and waits: captured into a graph that is then replayed
// (`captured`), else directly.
absl::Status RunAndWait(Gemm& gemm, const GemmArgs& args, bool captured) {
  absl::Status status = absl::OkStatus();
  if (captured) {
    testing::GraphTimer graph(1, [&](cudaStream_t stream) { status = gemm.Run(args, stream); });
    if (!status.ok()) return status;
    if (!graph.ok()) return absl::InternalError("graph capture");
    graph.Time();
  } else {
    status = gemm.Run(args, nullptr);
  }
  if (const cudaError_t error = cudaDeviceSynchronize(); error != cudaSuccess && status.ok()) {
    status = absl::InternalError(cudaGetErrorString(error));
  }
  return status;
}

// Each shape through each path.
class GemmTest : public ::testing::TestWithParam<std::tuple<Shape, int>> {};

// Against the double reference on the same bf16 values. A bf16 output is off
// by its rounding (relative 2^-8) plus fp32 accumulation; an fp32 output only
// by the accumulation order.
TEST_P(GemmTest, MatchesCpuReference) {
  const auto [s, path] = GetParam();
  const uint32_t seed = 7;
  std::printf("m=%lld n=%lld k=%lld bias=%d f32_out=%d accumulate=%d path=%d seed %u\n",
              static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k),
              s.bias, s.f32_out, s.accumulate, path, seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t x_stride = s.k + s.x_pad;
  std::vector<uint16_t> x(s.m * x_stride), w(s.n * s.k), bias(s.n);
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(s.k));
  for (auto& v : x) v = numeric::FloatToBf16(normal(rng));
  for (auto& v : w) v = numeric::FloatToBf16(normal(rng) * w_scale);
  for (auto& v : bias) v = numeric::FloatToBf16(normal(rng));
  std::vector<float> xf(s.m * s.k), bias_f(s.n);
  for (int64_t r = 0; r < s.m; ++r) {
    for (int64_t i = 0; i < s.k; ++i) xf[r * s.k + i] = numeric::Bf16ToFloat(x[r * x_stride + i]);
  }
  for (int64_t i = 0; i < s.n; ++i) bias_f[i] = numeric::Bf16ToFloat(bias[i]);
  std::vector<float> want(s.m * s.n);
  cpu::LinearReference(xf.data(), s.m, s.k, s.n, numeric::DType::kBF16, w.data(),
                       s.bias ? bias_f.data() : nullptr, want.data());
  const size_t y_bytes = s.f32_out ? 4 : 2;
  // Old contents of y: what accumulate adds to (random), else garbage.
  std::vector<float> old(s.m * s.n);
  for (auto& v : old) v = numeric::Bf16ToFloat(numeric::FloatToBf16(normal(rng)));
  if (s.accumulate) {
    for (size_t i = 0; i < want.size(); ++i) want[i] += old[i];
  }
  std::vector<char> y_old(old.size() * y_bytes);
  for (size_t i = 0; i < old.size(); ++i) {
    if (s.f32_out) {
      std::memcpy(y_old.data() + 4 * i, &old[i], 4);
    } else {
      const uint16_t b = numeric::FloatToBf16(old[i]);
      std::memcpy(y_old.data() + 2 * i, &b, 2);
    }
  }
  std::vector<float> bias32(bias_f);

  auto gemm = Gemm::Create(OptionsFor(path));
  ASSERT_THAT(gemm.status(), IsOk());
  void* dx = ToDevice(x);
  void* dw = ToDevice(w);
  void* db = s.f32_out ? static_cast<void*>(ToDevice(bias32)) : ToDevice(bias);
  void* dy = ToDevice(y_old);
  GemmArgs args{dx, x_stride, dw, s.bias ? db : nullptr, dy, s.n, s.m, s.n, s.k};
  args.y_dtype = s.f32_out ? numeric::DType::kF32 : numeric::DType::kBF16;
  args.accumulate = s.accumulate;
  ASSERT_THAT(RunAndWait(**gemm, args, path == kCublasTuned), IsOk());
  if (path == kCublasTuned) {
    std::printf("  tuned %d shape(s), %d off the first choice\n", (*gemm)->tune_stats().shapes,
                (*gemm)->tune_stats().changed);
  }
  std::vector<char> y(y_old.size());
  ASSERT_EQ(cudaMemcpy(y.data(), dy, y.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double got;
    if (s.f32_out) {
      float f;
      std::memcpy(&f, y.data() + 4 * i, 4);
      got = f;
    } else {
      uint16_t b;
      std::memcpy(&b, y.data() + 2 * i, 2);
      got = numeric::Bf16ToFloat(b);
    }
    const double err =
        std::fabs(got - want[i]) / std::max(1.0, std::fabs(static_cast<double>(want[i])));
    worst = std::max(worst, err);
  }
  std::printf("  max relative error %.3g\n", worst);
  EXPECT_LE(worst, s.f32_out ? 1e-4 : 8e-3);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(db);
  cudaFree(dy);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GemmTest,
    ::testing::Combine(
        ::testing::Values(
            Shape{1, 64, 32, false}, Shape{1, 4096, 4096, true}, Shape{3, 200, 136, true, 8},
            Shape{16, 6144, 4096, false}, Shape{77, 1000, 520, true},
            Shape{512, 512, 1024, false, 16}, Shape{1, 4096, 4096, false, 0, true},
            Shape{5, 4096, 14336, false, 0, true, true}, Shape{33, 896, 136, true, 8, true},
            Shape{64, 640, 256, true, 0, true, true}, Shape{9, 300, 200, false, 0, false, true},
            // One row (the GEMV's): odd n (a warp's row past n), k not a
            // multiple of a warp's 256-element sweep, bf16 accumulation,
            // k at the GEMV's limit, and past it or k % 8 != 0
            // (cuBLASLt's).
            Shape{1, 1001, 200, true, 8, true, true}, Shape{1, 77, 4104, true, 0, false, true},
            Shape{1, 3, 8, true, 0, true, true}, Shape{1, 50, 100, true},
            Shape{1, 4095, 14336, true, 0, true, true}, Shape{2, 1001, 200, true, 8, true, true},
            Shape{4, 77, 4104, true, 0, false, true}, Shape{6, 129, 1032, false, 16, true},
            Shape{7, 3, 8, true, 0, true, true}, Shape{8, 4095, 14336, true, 0, true, true},
            Shape{2, 50, 100, true}, Shape{12, 8000, 520, true, 8, true, true},
            Shape{16, 10000, 4096, false, 0, true}, Shape{1, 300, 8192, true, 0, true, true},
            Shape{11, 37, 72, true},
            // Hopper's GEMV: fewer items than SMs, a row longer than its
            // chunk by a partial chunk, and the 8B shapes' down projection
            // and head rows.
            Shape{1, 4096, 14336, false, 0, true, true}, Shape{1, 130, 2056, true, 8, true},
            Shape{1, 9000, 4096, true}, Shape{1, 5, 6152, false, 0, true, true},
            // Hopper's skinny GEMM: the 8B shape's o projection at batch 64
            // into the f32 residual (tiles split across CTAs), its q/k/v at
            // 48 rows, n not a multiple of 64 with k past a chunk, and x's
            // rows a stride apart; in clusters of 4, a CTA whose share of k
            // is empty (5 chunks in shares of 2).
            Shape{64, 4096, 4096, false, 0, true, true}, Shape{48, 6144, 4096, true},
            Shape{20, 1000, 4104, true, 0, false, true}, Shape{64, 96, 64, true, 24},
            Shape{10, 500, 300, true, 0, true, true},
            // An LM head's vocabulary into f32 logits (written, not
            // accumulated): 547 tiles of 128 rows.
            Shape{6, 70000, 64, false, 0, true}),
        ::testing::Values(kCublas, kGemv, kGemvBulk, kSkinny, kSkinnyTile64, kSkinnyCluster,
                          kGemvBulkStatic, kCublasTuned)));

// A shape is timed when first planned inside a capture, once, and never
// outside one; plans made outside a capture stay as they are.
TEST(GemmTuneTest, TimesCandidatesOnlyWhileCaptured) {
  auto gemm = Gemm::Create(OptionsFor(kCublasTuned));
  ASSERT_THAT(gemm.status(), IsOk());
  const int64_t m = 64, n = 4096, k = 4096;
  void* dx = ToDevice(std::vector<uint16_t>(m * k));
  void* dw = ToDevice(std::vector<uint16_t>(n * k));
  void* dy = ToDevice(std::vector<float>(m * n));
  GemmArgs args{dx, k, dw, nullptr, dy, n, m, n, k};
  args.y_dtype = numeric::DType::kF32;
  ASSERT_THAT(RunAndWait(**gemm, args, false), IsOk());
  EXPECT_EQ((*gemm)->tune_stats().shapes, 0);
  args.m = 32;
  ASSERT_THAT(RunAndWait(**gemm, args, true), IsOk());
  ASSERT_THAT(RunAndWait(**gemm, args, true), IsOk());
  args.m = 64;  // planned before, outside a capture
  ASSERT_THAT(RunAndWait(**gemm, args, true), IsOk());
  const Gemm::TuneStats stats = (*gemm)->tune_stats();
  std::printf("tuned %d shape(s), %d off the first choice, in %.3f s\n", stats.shapes,
              stats.changed, stats.seconds);
  EXPECT_EQ(stats.shapes, 1);
  EXPECT_GT(stats.seconds, 0);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
}

// The cluster split where the tiles fit one wave (a 132-SM H100 or H200):
// the 8B shape's o and down projections at 16 rows (32 tiles) in clusters
// (of 4 where 32 such clusters fit at once, else pairs: an H200 fits fewer),
// its q/k/v (48 tiles) in pairs, its gate/up (224 tiles) stream-K; without
// the option, never.
TEST(GemmSkinnyClusterTest, TakesClustersWhereTheTilesFitOneWave) {
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  if (!CurrentDeviceIsSm90() || sms < 128) {
    GTEST_SKIP() << "needs an sm_90 device of at least 128 SMs (" << sms << " here)";
  }
  auto split = Gemm::Create({.skinny = true, .skinny_cluster_split = true});
  auto plain = Gemm::Create({.skinny = true});
  ASSERT_THAT(split.status(), IsOk());
  ASSERT_THAT(plain.status(), IsOk());
  void* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 256), cudaSuccess);
  auto residual = [buffer](int64_t n, int64_t k) {
    GemmArgs args{buffer, k, buffer, nullptr, buffer, n, 16, n, k};
    args.y_dtype = numeric::DType::kF32;
    args.accumulate = true;
    return args;
  };
  const GemmArgs o = residual(4096, 4096);
  const GemmArgs down = residual(4096, 14336);
  const GemmArgs qkv{buffer, 4096, buffer, nullptr, buffer, 6144, 16, 6144, 4096};
  const GemmArgs gate_up{buffer, 4096, buffer, nullptr, buffer, 28672, 16, 28672, 4096};
  EXPECT_GE((*split)->SkinnyClusterSize(o), 2);
  EXPECT_EQ((*split)->SkinnyClusterSize(down), (*split)->SkinnyClusterSize(o));
  EXPECT_EQ((*split)->SkinnyClusterSize(qkv), 2);
  EXPECT_EQ((*split)->SkinnyClusterSize(gate_up), 0);
  EXPECT_EQ((*plain)->SkinnyClusterSize(o), 0);
  cudaFree(buffer);
}

TEST(GemmArgsTest, RejectsBadShapes) {
  auto gemm = Gemm::Create({.workspace_bytes = 0});
  ASSERT_THAT(gemm.status(), IsOk());
  GemmArgs args{};
  args.m = 1;
  args.n = 0;
  args.k = 4;
  EXPECT_EQ((*gemm)->Run(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.n = 4;
  EXPECT_EQ((*gemm)->Run(args, nullptr).code(), absl::StatusCode::kInvalidArgument);  // nulls
  args.m = 0;
  EXPECT_THAT((*gemm)->Run(args, nullptr), IsOk());
  int dummy = 0;
  args.m = 1;
  args.x = args.w = args.y = &dummy;
  args.x_stride = args.y_stride = 4;
  args.y_dtype = numeric::DType::kF16;
  EXPECT_EQ((*gemm)->Run(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// The gate/up projection with SwiGLU's activation fused (Hopper's GEMV for
// one row, its skinny GEMM for 2-64), against the double reference:
// silu(g) * u of the bf16 values, rounded to bf16. Elsewhere the call is
// refused with kFailedPrecondition.
struct SiluShape {
  int64_t half, k;
  bool bias;
  int64_t m = 1;
};

class GemmSiluMulTest : public ::testing::TestWithParam<SiluShape> {};

TEST_P(GemmSiluMulTest, MatchesCpuReference) {
  const SiluShape s = GetParam();
  const uint32_t seed = 11;
  std::printf("m=%lld half=%lld k=%lld bias=%d seed %u\n", static_cast<long long>(s.m),
              static_cast<long long>(s.half), static_cast<long long>(s.k), s.bias, seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 2 * s.half;
  std::vector<uint16_t> x(s.m * s.k), w(n * s.k);
  std::vector<float> bias(n);
  const float w_scale = 2.0f / std::sqrt(static_cast<float>(s.k));
  for (auto& v : x) v = numeric::FloatToBf16(normal(rng));
  for (auto& v : w) v = numeric::FloatToBf16(normal(rng) * w_scale);
  for (auto& v : bias) v = normal(rng);
  std::vector<float> xf(s.m * s.k), gate_up(s.m * n);
  for (size_t i = 0; i < x.size(); ++i) xf[i] = numeric::Bf16ToFloat(x[i]);
  cpu::LinearReference(xf.data(), s.m, s.k, n, numeric::DType::kBF16, w.data(),
                       s.bias ? bias.data() : nullptr, gate_up.data());
  auto gemm = Gemm::Create({.skinny = true});
  ASSERT_THAT(gemm.status(), IsOk());
  void* dx = ToDevice(x);
  void* dw = ToDevice(w);
  void* db = ToDevice(bias);
  void* dy = ToDevice(std::vector<uint16_t>(s.m * s.half, 0xffff));
  GemmArgs args{dx, s.k, dw, s.bias ? db : nullptr, dy, s.half, s.m, n, s.k};
  const absl::Status status = (*gemm)->RunSiluMul(args, nullptr);
  if (!CurrentDeviceIsSm90()) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE((*gemm)->FusesSiluMul(args));
  } else {
    ASSERT_THAT(status, IsOk());
    EXPECT_TRUE((*gemm)->FusesSiluMul(args));
    std::vector<uint16_t> y(s.m * s.half);
    ASSERT_EQ(cudaMemcpy(y.data(), dy, y.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    double worst = 0;
    for (int64_t r = 0; r < s.m; ++r) {
      for (int64_t j = 0; j < s.half; ++j) {
        const double g = gate_up[r * n + j], u = gate_up[r * n + s.half + j];
        const double want = g / (1.0 + std::exp(-g)) * u;
        const double got = numeric::Bf16ToFloat(y[r * s.half + j]);
        worst = std::max(worst, std::fabs(got - want) / std::max(1.0, std::fabs(want)));
      }
    }
    std::printf("  max relative error %.3g\n", worst);
    EXPECT_LE(worst, 8e-3);
  }
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(db);
  cudaFree(dy);
}

// One row: an odd number of outputs (the last item's second gate row past
// the end), a partial chunk, the 8B shape, and fewer items than CTAs. Rows:
// the 8B shape at batch 64, and odd counts of rows and outputs with a bias.
INSTANTIATE_TEST_SUITE_P(Shapes, GemmSiluMulTest,
                         ::testing::Values(SiluShape{7, 200, true}, SiluShape{1001, 2056, false},
                                           SiluShape{14336, 4096, false}, SiluShape{5, 6152, true},
                                           SiluShape{14336, 4096, false, 64},
                                           SiluShape{1001, 2056, true, 7},
                                           SiluShape{100, 136, true, 33}));

// By default only the fused gate/up of up to 64 rows takes the skinny GEMM
// (GemmOptions::skinny_silu_max_rows), on sm_90 alone.
TEST(GemmSiluMulDefaultsTest, FuseUpTo64Rows) {
  auto gemm = Gemm::Create();
  ASSERT_THAT(gemm.status(), IsOk());
  void* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 1 << 20), cudaSuccess);
  GemmArgs args{buffer, 64, buffer, nullptr, buffer, 64, 64, 128, 64};
  EXPECT_EQ((*gemm)->FusesSiluMul(args), CurrentDeviceIsSm90());
  args.m = 65;
  EXPECT_FALSE((*gemm)->FusesSiluMul(args));
  cudaFree(buffer);
}

TEST(GemmSiluMulArgsTest, RejectsBadShapes) {
  auto gemm = Gemm::Create({.workspace_bytes = 0});
  ASSERT_THAT(gemm.status(), IsOk());
  int dummy = 0;
  GemmArgs args{&dummy, 8, &dummy, nullptr, &dummy, 3, 1, 3, 8};
  EXPECT_EQ((*gemm)->RunSiluMul(args, nullptr).code(),
            absl::StatusCode::kInvalidArgument);  // odd n
  args.n = 4;
  args.m = 0;
  EXPECT_EQ((*gemm)->RunSiluMul(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  // Two rows want the skinny GEMM, which needs the workspace.
  args.m = 2;
  EXPECT_EQ((*gemm)->RunSiluMul(args, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  args.m = 1;
  args.w = nullptr;
  EXPECT_EQ((*gemm)->RunSiluMul(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trident::kernels::cuda
