// cuBLASLt bf16 GEMMs on the Llama-3-8B layer and head shapes: TFLOP/s, and
// for small m the weight-read GB/s against a device-to-device copy of the
// same bytes measured in the same run. The weights rotate over enough copies
// (>= 256 MiB in all) that no call finds its weights in L2, as in a forward
// pass. Output mode 0: bf16 y; 1: fp32 y accumulated into (the CUDA
// backend's projections).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/numeric/dtype.h"
#include "kernels/cuda/gemm/gemm.h"

namespace trident::kernels::cuda {
namespace {

void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool f32_out = state.range(3) == 1;
  const int64_t w_bytes = n * k * 2;
  const int64_t copies = std::max<int64_t>(1, ((int64_t{256} << 20) + w_bytes - 1) / w_bytes);
  void *x, *w, *y, *copy;
  cudaMalloc(&x, m * k * 2);
  cudaMalloc(&w, w_bytes * copies);
  cudaMalloc(&y, m * n * 4);
  cudaMalloc(&copy, w_bytes);
  cudaMemset(x, 0, m * k * 2);
  cudaMemset(w, 0, w_bytes * copies);
  cudaMemset(y, 0, m * n * 4);
  auto gemm = Gemm::Create();
  if (!gemm.ok()) {
    state.SkipWithError(std::string(gemm.status().message()).c_str());
    return;
  }
  GemmArgs args{x, k, w, nullptr, y, n, m, n, k};
  if (f32_out) {
    args.y_dtype = numeric::DType::kF32;
    args.accumulate = true;
  }
  auto weights = [&](int i) { return static_cast<const char*>(w) + (i % copies) * w_bytes; };
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  // The ceiling: copying the weight bytes (read + write) device to device.
  cudaEventRecord(start);
  for (int i = 0; i < 20; ++i) cudaMemcpyAsync(copy, w, n * k * 2, cudaMemcpyDeviceToDevice);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float copy_ms = 0;
  cudaEventElapsedTime(&copy_ms, start, stop);
  const double copy_gbps = 2.0 * n * k * 2 * 20 / (copy_ms * 1e-3) / 1e9;
  (void)(*gemm)->Run(args, nullptr);
  double total_ms = 0;
  for (auto _ : state) {
    cudaEventRecord(start);
    for (int i = 0; i < 10; ++i) {
      args.w = weights(i);
      (void)(*gemm)->Run(args, nullptr);
    }
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms * 1e-3 / 10);
    total_ms += ms / 10;
  }
  const double per_call_s = total_ms * 1e-3 / state.iterations();
  state.counters["TFLOPs"] = 2.0 * m * n * k / per_call_s / 1e12;
  state.counters["weight_GBps"] = n * k * 2.0 / per_call_s / 1e9;
  state.counters["copy_GBps"] = copy_gbps;
  state.counters["weight_vs_copy"] = n * k * 2.0 / per_call_s / 1e9 / copy_gbps;
  state.counters["weight_copies"] = static_cast<double>(copies);
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
  cudaFree(copy);
}

void Shapes(benchmark::internal::Benchmark* b) {
  for (int64_t mode : {0, 1}) {
    for (int64_t m : {1, 16, 64, 512, 4096}) {
      b->Args({m, 6144, 4096, mode});    // fused q/k/v
      b->Args({m, 4096, 4096, mode});    // o
      b->Args({m, 28672, 4096, mode});   // fused gate/up
      b->Args({m, 4096, 14336, mode});   // down
      b->Args({m, 128256, 4096, mode});  // head
    }
  }
}
BENCHMARK(BM_Gemm)->Apply(Shapes)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace trident::kernels::cuda
