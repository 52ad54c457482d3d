// Bandwidth of the bf16 SiLU·mul kernel against a device-to-device copy of
// the same bytes, measured in the same run.

#include <cuda_runtime_api.h>

#include "benchmark/benchmark.h"
#include "kernels/cuda/silu_mul/silu_mul.h"

namespace trident::kernels::cuda {
namespace {

void BM_SiluMul(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int64_t hidden = state.range(1);
  const size_t in_bytes = static_cast<size_t>(tokens * 2 * hidden * 2);
  const size_t out_bytes = static_cast<size_t>(tokens * hidden * 2);
  void* in = nullptr;
  void* out = nullptr;
  cudaMalloc(&in, in_bytes);
  cudaMalloc(&out, out_bytes);
  cudaMemset(in, 0, in_bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const SiluMulArgs args{.gate_up = in, .gate_up_stride = 2 * hidden, .out = out,
                         .out_stride = hidden, .num_tokens = tokens, .hidden = hidden};
  for (auto _ : state) {
    cudaEventRecord(start, nullptr);
    for (int i = 0; i < 20; ++i) (void)LaunchSiluMul(args, nullptr);
    cudaEventRecord(stop, nullptr);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3 / 20);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(in_bytes + out_bytes));
  cudaFree(in);
  cudaFree(out);
}

void BM_CopySameBytes(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int64_t hidden = state.range(1);
  // A copy that reads the input size and writes the output size moves the
  // same bytes as the kernel: the physical limit it is measured against.
  const size_t in_bytes = static_cast<size_t>(tokens * 2 * hidden * 2);
  const size_t out_bytes = static_cast<size_t>(tokens * hidden * 2);
  void* in = nullptr;
  void* out = nullptr;
  cudaMalloc(&in, in_bytes);
  cudaMalloc(&out, in_bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (auto _ : state) {
    cudaEventRecord(start, nullptr);
    for (int i = 0; i < 20; ++i) cudaMemcpyAsync(out, in, out_bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop, nullptr);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3 / 20);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(2 * out_bytes));
  cudaFree(in);
  cudaFree(out);
}

BENCHMARK(BM_SiluMul)->UseManualTime()->Args({1, 14336})->Args({64, 14336})->Args({4096, 14336});
BENCHMARK(BM_CopySameBytes)->UseManualTime()->Args({1, 14336})->Args({64, 14336})->Args({4096, 14336});

}  // namespace
}  // namespace trident::kernels::cuda
