// The cost of a dependent kernel in a decode step, apart from its work: a
// CUDA graph of 320 empty kernels (a layer's ten for 32 layers), each waiting
// for the one ahead, replayed; microseconds per kernel, with and without
// programmatic dependent launch, for grids of 1 to 1056 CTAs. A kernel fused
// away saves about this much a step. The counter the steps add to checks
// that the order held.

#include <cuda_runtime_api.h>

#include "benchmark/benchmark.h"
#include "kernels/cuda/pdl/pdl_chain.h"
#include "kernels/cuda/testing/device_timer.h"

namespace trident::kernels::cuda {
namespace {

constexpr int kSteps = 320;

void BM_PdlChain(benchmark::State& state) {
  const int blocks = static_cast<int>(state.range(0));
  const bool pdl = state.range(1) != 0;
  unsigned* counter = nullptr;
  cudaMalloc(reinterpret_cast<void**>(&counter), sizeof(unsigned));
  cudaMemset(counter, 0, sizeof(unsigned));
  {
    testing::GraphTimer timer(
        kSteps, [&](cudaStream_t stream) { LaunchChainStep(counter, blocks, pdl, stream); });
    if (!timer.ok()) {
      state.SkipWithError("graph capture failed");
    } else {
      timer.Time();  // warm-up
      double total_ms = 0;
      for (auto _ : state) {
        const float ms = timer.Time();
        state.SetIterationTime(ms * kSteps * 1e-3);
        total_ms += ms;
      }
      unsigned got = 0;
      cudaMemcpy(&got, counter, sizeof(got), cudaMemcpyDeviceToHost);
      const unsigned want = static_cast<unsigned>(kSteps * (state.iterations() + 1));
      if (got != want) state.SkipWithError("the chain's order did not hold");
      state.counters["us_per_kernel"] = total_ms * 1e3 / state.iterations();
    }
  }
  cudaFree(counter);
}
BENCHMARK(BM_PdlChain)
    ->ArgNames({"blocks", "pdl"})
    ->ArgsProduct({{1, 8, 132, 264, 1056}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace trident::kernels::cuda
