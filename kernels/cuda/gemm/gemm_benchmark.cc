// cuBLASLt bf16 GEMMs on the Llama-3-8B layer shapes: TFLOP/s, and for small
// m the weight-read GB/s against a device-to-device copy of the same bytes
// measured in the same run.

#include <cuda_runtime_api.h>

#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cuda/gemm/gemm.h"

namespace trident::kernels::cuda {
namespace {

void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  void *x, *w, *y, *copy;
  cudaMalloc(&x, m * k * 2);
  cudaMalloc(&w, n * k * 2);
  cudaMalloc(&y, m * n * 2);
  cudaMalloc(&copy, n * k * 2);
  cudaMemset(x, 0, m * k * 2);
  cudaMemset(w, 0, n * k * 2);
  auto gemm = Gemm::Create();
  if (!gemm.ok()) {
    state.SkipWithError(std::string(gemm.status().message()).c_str());
    return;
  }
  GemmArgs args{x, k, w, nullptr, y, n, m, n, k};
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
    for (int i = 0; i < 10; ++i) (void)(*gemm)->Run(args, nullptr);
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
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
  cudaFree(copy);
}

void Shapes(benchmark::internal::Benchmark* b) {
  for (int64_t m : {1, 16, 64, 512, 4096}) {
    b->Args({m, 6144, 4096});   // fused q/k/v
    b->Args({m, 4096, 4096});   // o
    b->Args({m, 28672, 4096});  // fused gate/up
    b->Args({m, 4096, 14336});  // down
  }
}
BENCHMARK(BM_Gemm)->Apply(Shapes)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace trident::kernels::cuda
