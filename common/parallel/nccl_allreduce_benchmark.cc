// In-place all-reduce (sum) over NcclGroup, timed as nccl-tests times it:
// many back-to-back collectives on each rank's stream, the time per call
// from events on rank 0's stream after every rank finished. Counters: algbw
// (bytes / time) and busbw (algbw x 2(n-1)/n, the per-link figure a ring
// reaches), GB/s. The sizes a tensor-parallel step sums: one token's hidden
// row (4096 bf16 = 8 KiB, 8192 = 16 KiB), a batch of 64 of them (512 KiB,
// 1 MiB), a prefill chunk, and large buffers for the link's bandwidth.
// Rows for more ranks than the machine has are skipped.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/numeric/dtype.h"
#include "common/parallel/nccl_group.h"

namespace trident::parallel {
namespace {

constexpr int kCallsPerIteration = 20;

void BM_AllReduce(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  const int64_t bytes = state.range(1);
  const numeric::DType dtype = state.range(2) == 0 ? numeric::DType::kF32 : numeric::DType::kBF16;
  int count = 0;
  cudaGetDeviceCount(&count);
  if (count < ranks) return state.SkipWithError("fewer GPUs than ranks");
  std::vector<int> devices(ranks);
  std::iota(devices.begin(), devices.end(), 0);
  auto group = NcclGroup::Create(devices);
  if (!group.ok()) return state.SkipWithError(std::string(group.status().message()).c_str());
  std::vector<void*> buffers(ranks);
  std::vector<cudaStream_t> streams(ranks);
  for (int r = 0; r < ranks; ++r) {
    cudaSetDevice(r);
    cudaMalloc(&buffers[r], bytes);
    cudaMemset(buffers[r], 0, bytes);
    cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking);
  }
  const size_t elems = static_cast<size_t>(bytes) / (dtype == numeric::DType::kF32 ? 4 : 2);
  auto round = [&](int calls) {
    for (int i = 0; i < calls; ++i) {
      if (!(*group)->AllReduceSum(buffers, elems, dtype, streams).ok()) return false;
    }
    return true;
  };
  round(5);  // Warm-up: NCCL connects lazily.
  for (int r = 0; r < ranks; ++r) {
    cudaSetDevice(r);
    cudaStreamSynchronize(streams[r]);
  }
  cudaSetDevice(0);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (auto _ : state) {
    cudaEventRecord(start, streams[0]);
    if (!round(kCallsPerIteration)) return state.SkipWithError("all-reduce failed");
    cudaEventRecord(stop, streams[0]);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3 / kCallsPerIteration);
  }
  for (int r = 0; r < ranks; ++r) {
    cudaSetDevice(r);
    cudaStreamSynchronize(streams[r]);
  }
  const double per_call = kCallsPerIteration * static_cast<double>(bytes) / 1e9;
  state.counters["algbw_GB/s"] = benchmark::Counter(per_call / kCallsPerIteration,
                                                    benchmark::Counter::kIsIterationInvariantRate);
  state.counters["busbw_GB/s"] =
      benchmark::Counter(per_call / kCallsPerIteration * 2.0 * (ranks - 1) / ranks,
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(numeric::DTypeName(dtype)));
  cudaSetDevice(0);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  for (int r = 0; r < ranks; ++r) {
    cudaSetDevice(r);
    cudaFree(buffers[r]);
    cudaStreamDestroy(streams[r]);
  }
}

BENCHMARK(BM_AllReduce)
    ->UseManualTime()
    ->ArgNames({"ranks", "bytes", "bf16"})
    ->ArgsProduct({{2, 4},
                   {8 << 10, 16 << 10, 32 << 10, 512 << 10, 1 << 20, 16 << 20, 256 << 20},
                   {0, 1}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace trident::parallel
