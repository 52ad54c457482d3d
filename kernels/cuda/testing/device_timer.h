// Benchmark timing for CUDA kernels. TimeOnDevice: each iteration enqueues
// `launch` `launches_per_iteration` times on the default stream between two
// CUDA events, and reports the per-launch device time (use with
// UseManualTime()) and `bytes_per_launch` as the bytes processed.
// GraphTimer: launches captured once into a CUDA graph and replayed, as the
// backend replays a decode step (no host launch cost between kernels).

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

// Captures `launches` calls of launch(stream) on its own stream into a CUDA
// graph at construction; Time() replays it once. Not thread-safe.
class GraphTimer {
 public:
  template <typename Launch>
  GraphTimer(int launches, Launch launch) : launches_(launches) {
    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    cudaEventCreate(&start_);
    cudaEventCreate(&stop_);
    cudaGraph_t graph = nullptr;
    cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
    for (int i = 0; i < launches; ++i) launch(stream_);
    ok_ = cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph != nullptr &&
          cudaGraphInstantiate(&exec_, graph, 0) == cudaSuccess;
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  GraphTimer(const GraphTimer&) = delete;
  GraphTimer& operator=(const GraphTimer&) = delete;
  ~GraphTimer() {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }

  // Whether the capture and instantiation succeeded; Time() needs it.
  bool ok() const { return ok_; }

  // Replays the graph once: milliseconds per captured call.
  float Time() {
    cudaEventRecord(start_, stream_);
    cudaGraphLaunch(exec_, stream_);
    cudaEventRecord(stop_, stream_);
    cudaEventSynchronize(stop_);
    float ms = 0;
    cudaEventElapsedTime(&ms, start_, stop_);
    return ms / launches_;
  }

 private:
  int launches_;
  bool ok_ = false;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace trident::kernels::cuda::testing

#endif  // TRIDENT_KERNELS_CUDA_TESTING_DEVICE_TIMER_H_
