// A prompt's KV from one GPU to another, Llama-3-8B shape (32 layers, 8 KV
// heads of 128, bf16: a 16-token block of one layer is 64 KiB with K and V),
// blocks scattered over the destination pool. Bytes per second of:
//   mode 0  one cudaMemcpyPeerAsync of the whole prompt, contiguous: the
//           ceiling (the copy engines over NVLink);
//   mode 1  one cudaMemcpyPeerAsync per (layer, block);
//   mode 2  LaunchBlockCopy on the destination GPU, pulling from the peer;
//   mode 3  LaunchBlockCopy on the source GPU, pushing to the peer.
// Every row measures mode 0 on the same bytes in the same run and reports
// of_memcpy_peer, its ratio to it. With one GPU both pools are on it.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cuda/block_copy/block_copy.h"

namespace trident::kernels::cuda {
namespace {

constexpr int64_t kLayers = 32;
constexpr int64_t kBlockTokens = 16;
constexpr int64_t kBlockBytes = kBlockTokens * 8 * 128 * 2 * 2;

float ElapsedMs(cudaEvent_t start, cudaEvent_t stop) {
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  return ms;
}

void BM_KvLane(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int mode = static_cast<int>(state.range(1));
  int count = 0;
  cudaGetDeviceCount(&count);
  const int src_dev = count >= 2 ? 1 : 0;
  const int dst_dev = 0;
  if (src_dev != dst_dev) {
    for (int d : {0, 1}) {
      cudaSetDevice(d);
      cudaDeviceEnablePeerAccess(1 - d, 0);
      cudaGetLastError();
    }
  }
  const int64_t blocks = tokens / kBlockTokens * kLayers;
  const size_t bytes = static_cast<size_t>(blocks * kBlockBytes);
  void* src = nullptr;
  void* dst = nullptr;
  cudaSetDevice(src_dev);
  if (cudaMalloc(&src, bytes) != cudaSuccess) return state.SkipWithError("cudaMalloc src");
  cudaMemset(src, 1, bytes);
  cudaSetDevice(dst_dev);
  if (cudaMalloc(&dst, bytes) != cudaSuccess) return state.SkipWithError("cudaMalloc dst");
  std::vector<int64_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(7);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<const void*> from(blocks);
  std::vector<void*> to(blocks);
  for (int64_t i = 0; i < blocks; ++i) {
    from[i] = static_cast<const char*>(src) + i * kBlockBytes;
    to[i] = static_cast<char*>(dst) + order[i] * kBlockBytes;
  }
  const int launch_dev = mode == 3 ? src_dev : dst_dev;
  cudaSetDevice(launch_dev);
  void* tables = nullptr;
  cudaMalloc(&tables, 2 * blocks * sizeof(void*));
  cudaMemcpy(tables, from.data(), blocks * sizeof(void*), cudaMemcpyHostToDevice);
  void** dst_table = static_cast<void**>(tables) + blocks;
  cudaMemcpy(dst_table, to.data(), blocks * sizeof(void*), cudaMemcpyHostToDevice);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const BlockCopyArgs args{.src = static_cast<const void* const*>(tables),
                           .dst = dst_table,
                           .num_blocks = blocks,
                           .block_bytes = kBlockBytes};
  auto whole = [&] { cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, bytes, stream); };
  auto run = [&] {
    if (mode == 0) {
      whole();
    } else if (mode == 1) {
      for (int64_t i = 0; i < blocks; ++i) {
        cudaMemcpyPeerAsync(to[i], dst_dev, from[i], src_dev, kBlockBytes, stream);
      }
    } else {
      (void)LaunchBlockCopy(args, stream);
    }
  };
  auto time = [&](auto&& f) {
    cudaEventRecord(start, stream);
    f();
    cudaEventRecord(stop, stream);
    return ElapsedMs(start, stop);
  };
  time(whole);
  time(run);  // Warm-up.
  float ceiling_ms = 1e30f;
  for (int i = 0; i < 3; ++i) ceiling_ms = std::min(ceiling_ms, time(whole));
  for (auto _ : state) state.SetIterationTime(time(run) / 1e3);
  if (cudaStreamSynchronize(stream) != cudaSuccess) state.SkipWithError("copy failed");
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
  const double ceiling_gbps = bytes / (ceiling_ms * 1e-3) / 1e9;
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes) / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
  state.counters["memcpy_peer_GB/s"] = ceiling_gbps;
  state.counters["of_memcpy_peer"] =
      benchmark::Counter(static_cast<double>(bytes) / 1e9 / ceiling_gbps,
                         benchmark::Counter::kIsIterationInvariantRate);
  const char* names[] = {"memcpy_peer whole", "memcpy_peer per block", "kernel pull",
                         "kernel push"};
  state.SetLabel(std::string(names[mode]) + (src_dev == dst_dev ? " (one GPU)" : " (2 GPUs)"));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  cudaFree(tables);
  cudaSetDevice(src_dev);
  cudaFree(src);
  cudaSetDevice(dst_dev);
  cudaFree(dst);
}

BENCHMARK(BM_KvLane)
    ->UseManualTime()
    ->ArgNames({"tokens", "mode"})
    ->ArgsProduct({{1024, 4096, 8192, 32768}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace trident::kernels::cuda
