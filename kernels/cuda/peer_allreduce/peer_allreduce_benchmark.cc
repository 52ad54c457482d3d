// The one-shot peer all-reduce of f32 vectors over 2 and 4 GPUs, timed as
// common/parallel's nccl_allreduce_benchmark times NCCL (back-to-back calls
// on every rank, events on rank 0's stream): run both in one session for the
// comparison. Counters: algbw (bytes / time) and busbw (x 2(n-1)/n), GB/s.
// Rows for more ranks than GPUs are skipped.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cuda/peer_allreduce/peer_allreduce.h"

namespace trident::kernels::cuda {
namespace {

constexpr int kCallsPerIteration = 20;

void BM_PeerAllReduce(benchmark::State& state) {
  const int ranks = static_cast<int>(state.range(0));
  const int64_t bytes = state.range(1);
  const int64_t count = bytes / 4;
  int devices = 0;
  cudaGetDeviceCount(&devices);
  if (devices < ranks) return state.SkipWithError("fewer GPUs than ranks");
  for (int d = 0; d < ranks; ++d) {
    cudaSetDevice(d);
    for (int p = 0; p < ranks; ++p) {
      if (p != d) cudaDeviceEnablePeerAccess(p, 0);
    }
    cudaGetLastError();
  }
  std::vector<float*> in(ranks), out(ranks);
  std::vector<void*> signals(ranks);
  std::vector<cudaStream_t> streams(ranks);
  for (int r = 0; r < ranks; ++r) {
    cudaSetDevice(r);
    cudaMalloc(reinterpret_cast<void**>(&in[r]), bytes);
    cudaMalloc(reinterpret_cast<void**>(&out[r]), bytes);
    cudaMemset(in[r], 0, bytes);
    cudaMalloc(&signals[r], PeerAllReduceSignalBytes());
    cudaMemset(signals[r], 0, PeerAllReduceSignalBytes());
    cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking);
    cudaDeviceSynchronize();
  }
  std::vector<PeerAllReduceArgs> args(ranks);
  for (int r = 0; r < ranks; ++r) {
    args[r].rank = r;
    args[r].ranks = ranks;
    for (int q = 0; q < ranks; ++q) {
      args[r].in[q] = in[q];
      args[r].signals[q] = signals[q];
    }
    args[r].out = out[r];
    args[r].count = count;
  }
  auto round = [&](int calls) {
    for (int i = 0; i < calls; ++i) {
      for (int r = 0; r < ranks; ++r) {
        cudaSetDevice(r);
        if (!LaunchPeerAllReduce(args[r], streams[r]).ok()) return false;
      }
    }
    return true;
  };
  auto sync = [&] {
    for (int r = 0; r < ranks; ++r) {
      cudaSetDevice(r);
      cudaStreamSynchronize(streams[r]);
    }
  };
  round(5);
  sync();
  cudaSetDevice(0);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (auto _ : state) {
    cudaSetDevice(0);
    cudaEventRecord(start, streams[0]);
    if (!round(kCallsPerIteration)) return state.SkipWithError("launch failed");
    cudaSetDevice(0);
    cudaEventRecord(stop, streams[0]);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3 / kCallsPerIteration);
  }
  sync();
  for (int r = 0; r < ranks; ++r) {
    auto failed = PeerAllReduceFailed(signals[r]);
    if (!failed.ok() || *failed) state.SkipWithError("a rank timed out");
  }
  const double gb = static_cast<double>(bytes) / 1e9;
  state.counters["algbw_GB/s"] =
      benchmark::Counter(gb, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["busbw_GB/s"] = benchmark::Counter(gb * 2.0 * (ranks - 1) / ranks,
                                                    benchmark::Counter::kIsIterationInvariantRate);
  cudaSetDevice(0);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  for (int r = 0; r < ranks; ++r) {
    cudaSetDevice(r);
    cudaFree(in[r]);
    cudaFree(out[r]);
    cudaFree(signals[r]);
    cudaStreamDestroy(streams[r]);
  }
}

BENCHMARK(BM_PeerAllReduce)
    ->UseManualTime()
    ->ArgNames({"ranks", "bytes"})
    ->ArgsProduct({{2, 4}, {8 << 10, 16 << 10, 32 << 10, 512 << 10, 1 << 20, 16 << 20}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace trident::kernels::cuda
