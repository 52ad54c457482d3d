// RmsNorm and AddRmsNorm throughput; bytes are those the kernel must move
// (x and out, plus residual read and write and delta for the fused one).
//
//   bazel run --config=opt //kernels/cpu/rms_norm:rms_norm_benchmark

#include <cstdint>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/rms_norm/rms_norm.h"

namespace trident::kernels::cpu {
namespace {

std::vector<float> RandomVector(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void BM_RmsNorm(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const int64_t dim = state.range(1);
  const std::vector<float> x = RandomVector(rows * dim, 1);
  const std::vector<float> weight = RandomVector(dim, 2);
  std::vector<float> out(rows * dim);
  for (auto _ : state) {
    RmsNorm(x.data(), weight.data(), rows, dim, 1e-5f, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * rows * dim * sizeof(float));
}
BENCHMARK(BM_RmsNorm)->ArgsProduct({{1, 16, 512}, {4096, 8192}});

void BM_AddRmsNorm(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const int64_t dim = state.range(1);
  std::vector<float> residual = RandomVector(rows * dim, 1);
  const std::vector<float> delta = RandomVector(rows * dim, 3);
  const std::vector<float> weight = RandomVector(dim, 2);
  std::vector<float> out(rows * dim);
  for (auto _ : state) {
    AddRmsNorm(residual.data(), delta.data(), weight.data(), rows, dim, 1e-5f, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 4 * rows * dim * sizeof(float));
}
BENCHMARK(BM_AddRmsNorm)->ArgsProduct({{1, 16, 512}, {4096, 8192}});

}  // namespace
}  // namespace trident::kernels::cpu
