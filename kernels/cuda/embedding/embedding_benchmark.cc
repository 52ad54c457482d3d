// Bandwidth of the bf16 embedding gather against a device-to-device copy of
// the same bytes, measured in the same run: the copy's GB/s is the ceiling the
// gather's GB/s is read against.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cuda/embedding/embedding.h"
#include "kernels/cuda/testing/device_timer.h"

namespace trident::kernels::cuda {
namespace {

constexpr int64_t kVocab = 128256;

// Device buffers for a (tokens, hidden) gather from a kVocab-row table, with
// random ids (seed 7), freed on destruction.
struct Buffers {
  Buffers(int64_t tokens, int64_t hidden) : out_bytes(static_cast<size_t>(tokens * hidden * 2)) {
    cudaMalloc(&table, static_cast<size_t>(kVocab * hidden * 2));
    cudaMemset(table, 0, static_cast<size_t>(kVocab * hidden * 2));
    cudaMalloc(&out, out_bytes);
    cudaMalloc(&copy_src, out_bytes);
    cudaMalloc(reinterpret_cast<void**>(&ids), static_cast<size_t>(tokens * 4));
    std::mt19937 rng(7);
    std::vector<int32_t> host_ids(tokens);
    for (int32_t& id : host_ids) id = static_cast<int32_t>(rng() % kVocab);
    cudaMemcpy(ids, host_ids.data(), host_ids.size() * 4, cudaMemcpyHostToDevice);
  }
  ~Buffers() {
    cudaFree(table);
    cudaFree(out);
    cudaFree(copy_src);
    cudaFree(ids);
  }
  size_t out_bytes;
  void* table = nullptr;
  void* out = nullptr;
  void* copy_src = nullptr;
  int32_t* ids = nullptr;
};

void BM_Embedding(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int64_t hidden = state.range(1);
  Buffers buffers(tokens, hidden);
  const EmbeddingArgs args{.token_ids = buffers.ids,
                           .num_tokens = tokens,
                           .table = buffers.table,
                           .vocab = kVocab,
                           .hidden = hidden,
                           .out = buffers.out};
  // Rows read plus rows written (the ids are noise).
  testing::TimeOnDevice(state, 2 * buffers.out_bytes,
                        [&] { (void)LaunchEmbedding(args, nullptr); });
}

void BM_CopyCeiling(benchmark::State& state) {
  Buffers buffers(state.range(0), state.range(1));
  testing::TimeOnDevice(state, 2 * buffers.out_bytes, [&] {
    cudaMemcpyAsync(buffers.out, buffers.copy_src, buffers.out_bytes, cudaMemcpyDeviceToDevice);
  });
}

BENCHMARK(BM_Embedding)
    ->UseManualTime()
    ->Args({1, 4096})
    ->Args({64, 4096})
    ->Args({4096, 4096})
    ->Args({4096, 5120});
BENCHMARK(BM_CopyCeiling)
    ->UseManualTime()
    ->Args({1, 4096})
    ->Args({64, 4096})
    ->Args({4096, 4096})
    ->Args({4096, 5120});

}  // namespace
}  // namespace trident::kernels::cuda
