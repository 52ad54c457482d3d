// The cost of a dependent kernel in a decode step, apart from its work: a
// CUDA graph of 320 empty kernels (a layer's ten for 32 layers), each waiting
// for the one ahead, replayed; microseconds per kernel, with and without
// programmatic dependent launch, for grids of 1 to 1056 CTAs. A kernel fused
// away saves about this much a step. The counter the steps add to checks
// that the order held.

#include <cuda_runtime_api.h>

#include "benchmark/benchmark.h"
#include "kernels/cuda/pdl/pdl_chain.h"

namespace trident::kernels::cuda {
namespace {

constexpr int kSteps = 320;

void BM_PdlChain(benchmark::State& state) {
  const int blocks = static_cast<int>(state.range(0));
  const bool pdl = state.range(1) != 0;
  unsigned* counter = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&counter), sizeof(unsigned));
  cudaMemset(counter, 0, sizeof(unsigned));
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < kSteps; ++i) LaunchChainStep(counter, blocks, pdl, stream);
  cudaStreamEndCapture(stream, &graph);
  if (graph == nullptr || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    state.SkipWithError("graph capture failed");
    cudaFree(counter);
    cudaStreamDestroy(stream);
    return;
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaGraphLaunch(exec, stream);  // warm-up
  double total_ms = 0;
  for (auto _ : state) {
    cudaEventRecord(start, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms * 1e-3);
    total_ms += ms;
  }
  unsigned got = 0;
  cudaMemcpy(&got, counter, sizeof(got), cudaMemcpyDeviceToHost);
  const unsigned want = static_cast<unsigned>(kSteps * (state.iterations() + 1));
  if (got != want) state.SkipWithError("the chain's order did not hold");
  state.counters["us_per_kernel"] = total_ms * 1e3 / state.iterations() / kSteps;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaFree(counter);
  cudaStreamDestroy(stream);
}
BENCHMARK(BM_PdlChain)
    ->ArgNames({"blocks", "pdl"})
    ->ArgsProduct({{1, 8, 132, 264, 1056}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace trident::kernels::cuda
