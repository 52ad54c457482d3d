// How fast a device computes generated weights in place: bf16 elements per
// second of LaunchRandomFillBf16 into a 1 GiB buffer (a 70B rank's shard is
// ~35 GB), against cudaMemsetAsync of the same buffer in the same run (the
// device's write ceiling): of_memset is the fill's bytes per second over
// the memset's.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "benchmark/benchmark.h"
#include "common/numeric/counter_stream.h"
#include "kernels/cuda/random_fill/random_fill.h"

namespace trident::kernels::cuda {
namespace {

constexpr int64_t kCols = 8192;

float TimeMs(cudaEvent_t start, cudaEvent_t stop, const auto& launch) {
  cudaEventRecord(start, nullptr);
  launch();
  cudaEventRecord(stop, nullptr);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  return ms;
}

void BM_RandomFill(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const size_t bytes = static_cast<size_t>(rows * kCols * 2);
  uint16_t* out = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&out), bytes) != cudaSuccess)
    return state.SkipWithError("cudaMalloc");
  numeric::CounterStreamBlock block;
  block.base = numeric::SplitMix64(5);
  block.half_width = 0.02f;
  block.tensor_cols = kCols;
  block.rows = rows;
  block.cols = kCols;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  auto fill = [&] { (void)LaunchRandomFillBf16({&block, nullptr, out}, nullptr); };
  auto memset = [&] { cudaMemsetAsync(out, 0, bytes, nullptr); };
  TimeMs(start, stop, fill);  // Warm-up.
  float memset_ms = 1e30f;
  for (int i = 0; i < 3; ++i) memset_ms = std::min(memset_ms, TimeMs(start, stop, memset));
  for (auto _ : state) state.SetIterationTime(TimeMs(start, stop, fill) / 1e3);
  if (cudaDeviceSynchronize() != cudaSuccess) state.SkipWithError("fill failed");
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  state.counters["elements/s"] = benchmark::Counter(static_cast<double>(rows * kCols),
                                                    benchmark::Counter::kIsIterationInvariantRate);
  const double memset_gbps = bytes / (memset_ms * 1e-3) / 1e9;
  state.counters["memset_GB/s"] = memset_gbps;
  state.counters["of_memset"] = benchmark::Counter(static_cast<double>(bytes) / 1e9 / memset_gbps,
                                                   benchmark::Counter::kIsIterationInvariantRate);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(out);
}

// 128 MiB and 1 GiB of bf16, 8192 columns (a 70B shape's hidden size).
BENCHMARK(BM_RandomFill)->Arg(8192)->Arg(65536)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace trident::kernels::cuda

BENCHMARK_MAIN();
