// Benchmark timing for CUDA kernels: each iteration enqueues `launch`
// `launches_per_iteration` times on the default stream between two CUDA
// events, and reports the per-launch device time (use with UseManualTime())
// and `bytes_per_launch` as the bytes processed.

#ifndef TRIDENT_KERNELS_CUDA_TESTING_DEVICE_TIMER_H_
#define TRIDENT_KERNELS_CUDA_TESTING_DEVICE_TIMER_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "benchmark/benchmark.h"

namespace trident::kernels::cuda::testing {

template <typename Launch>
void TimeOnDevice(benchmark::State& state, size_t bytes_per_launch, Launch launch,
                  int launches_per_iteration = 20) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (auto _ : state) {
    cudaEventRecord(start, nullptr);
    for (int i = 0; i < launches_per_iteration; ++i) launch();
    cudaEventRecord(stop, nullptr);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3 / launches_per_iteration);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes_per_launch));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace trident::kernels::cuda::testing

#endif  // TRIDENT_KERNELS_CUDA_TESTING_DEVICE_TIMER_H_
