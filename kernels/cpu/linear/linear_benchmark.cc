// Linear::Forward on Llama-3-8B projection shapes. Reports GFLOP/s and, the
// number that matters for decode (m = 1), the GB/s of packed weights read.
//
//   bazel run --config=opt //kernels/cpu/linear:linear_benchmark

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/logging/log.h"
#include "common/numeric/dtype.h"
#include "kernels/cpu/linear/linear.h"

namespace trident::kernels::cpu {
namespace {

void BM_Linear(benchmark::State& state) {
  const int64_t m = state.range(0);
  const int64_t in_features = state.range(1);
  const int64_t out_features = state.range(2);
  const numeric::DType dtype = state.range(3) == 16 ? numeric::DType::kBF16 : numeric::DType::kF32;
  std::mt19937 rng(1);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> weight(in_features * out_features);
  for (float& w : weight) w = unit(rng) * 0.02f;
  std::vector<uint16_t> weight_bf16(weight.size());
  numeric::FloatToBf16(weight.data(), weight_bf16.data(), weight.size());
  absl::StatusOr<std::unique_ptr<Linear>> linear = Linear::Create(
      in_features, out_features, dtype,
      dtype == numeric::DType::kBF16 ? static_cast<const void*>(weight_bf16.data()) : weight.data(),
      nullptr);
  TRIDENT_CHECK_OK(linear.status());
  std::vector<float> x(m * in_features);
  for (float& v : x) v = unit(rng);
  std::vector<float> y(m * out_features);
  (*linear)->Forward(x.data(), m, y.data());  // Creates the primitive.
  for (auto _ : state) {
    (*linear)->Forward(x.data(), m, y.data());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * m * in_features * out_features;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_GB/s"] = benchmark::Counter((*linear)->packed_weight_bytes() * 1e-9,
                                                     benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(numeric::DTypeName((*linear)->compute_dtype())) + " " +
                 (*linear)->ImplementationName(m));
}

// {m, in, out, weight bits}: q/o projection 4096x4096, gate/up 4096->14336,
// down 14336->4096.
BENCHMARK(BM_Linear)
    ->ArgsProduct({{1, 16, 128, 1024}, {4096}, {4096, 14336}, {32, 16}})
    ->Args({1, 14336, 4096, 16})
    ->Args({1, 14336, 4096, 32})
    ->UseRealTime();

}  // namespace
}  // namespace trident::kernels::cpu
