// Causal prefill of one sequence through the paged prefill kernel: 32 q heads,
// 8 kv heads, head_dim 128 (and 64/80/96/256 at 8192 tokens), block size 16
// on shuffled blocks. Reports TFLOP/s
// counting the causal half of both matmuls, 2 * 2 * L * L / 2 * heads *
// head_dim, and the ratio to the H200's dense bf16 tensor-core peak
// (989 TFLOP/s, a datasheet figure, not measured here). With fp8 = 1 the
// cache is FP8 E4M3 (kernels/cpu/paged_kv_fp8's layout), dequantized into
// the kernel's bf16 tiles as it loads them.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cuda/paged_prefill_attention/paged_prefill_attention.h"

namespace trident::kernels::cuda {
namespace {

constexpr int kLaunchesPerIteration = 5;
constexpr double kPeakTflops = 989.0;
constexpr int32_t kNumQHeads = 32;
constexpr int32_t kNumKvHeads = 8;

// Small bf16 values (bits of floats in about [-1, 1)) from a fixed LCG.
std::vector<uint16_t> RandomBf16(size_t n, uint32_t seed) {
  std::vector<uint16_t> v(n);
  uint32_t x = seed;
  for (uint16_t& e : v) {
    x = x * 1664525u + 1013904223u;
    // Sign, exponent 120..126, 7 random mantissa bits.
    e = static_cast<uint16_t>(((x >> 31) << 15) | ((120u + (x >> 24) % 7u) << 7) |
                              ((x >> 8) & 0x7fu));
  }
  return v;
}

template <typename T>
void* Upload(const std::vector<T>& host) {
  void* p = nullptr;
  cudaMalloc(&p, host.size() * sizeof(T));
  cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return p;
}

void BM_PagedPrefillCausal(benchmark::State& state) {
  const int32_t len = static_cast<int32_t>(state.range(0));
  const int32_t head_dim = static_cast<int32_t>(state.range(1));
  const bool fp8 = state.range(2) != 0;
  const bool wgmma = state.range(3) != 0;
  const int32_t block_size = static_cast<int32_t>(state.range(4));
  const int32_t num_blocks = len / block_size;
  const int64_t half = static_cast<int64_t>(kNumKvHeads) * block_size * head_dim;
  // FP8: bytes of K, V and the f32 scales per block.
  const int64_t fp8_block = 2 * half + int64_t{2} * kNumKvHeads * block_size * 4;
  const int64_t row = static_cast<int64_t>(kNumQHeads) * head_dim;
  std::vector<int32_t> table(num_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  // FP8: every byte 0x3c (elements 1.5, scales about 0.0115).
  void* d_cache = nullptr;
  if (fp8) {
    cudaMalloc(&d_cache, static_cast<size_t>(num_blocks) * fp8_block);
    cudaMemset(d_cache, 0x3c, static_cast<size_t>(num_blocks) * fp8_block);
  } else {
    d_cache = Upload(RandomBf16(static_cast<size_t>(num_blocks) * 2 * half, 1));
  }
  void* d_q = Upload(RandomBf16(static_cast<size_t>(len) * row, 2));
  void* d_out = nullptr;
  cudaMalloc(&d_out, static_cast<size_t>(len) * row * 2);
  void* d_table = Upload(table);
  void* d_context = Upload(std::vector<int32_t>{len});
  void* d_query = Upload(std::vector<int32_t>{len});
  void* d_start = Upload(std::vector<int32_t>{0});
  const PagedPrefillArgs args{.q = d_q,
                              .q_stride = row,
                              .out = d_out,
                              .out_stride = row,
                              .kv_base = d_cache,
                              .kv_fp8 = fp8,
                              .block_stride_elems = fp8 ? fp8_block : 2 * half,
                              .value_offset_elems = half,
                              .scale_offset_elems = fp8 ? 2 * half : 0,
                              .block_size = block_size,
                              .num_q_heads = kNumQHeads,
                              .num_kv_heads = kNumKvHeads,
                              .head_dim = head_dim,
                              .block_tables = static_cast<const int32_t*>(d_table),
                              .max_blocks_per_seq = num_blocks,
                              .context_lens = static_cast<const int32_t*>(d_context),
                              .query_lens = static_cast<const int32_t*>(d_query),
                              .query_starts = static_cast<const int32_t*>(d_start),
                              .batch = 1,
                              .max_query_len = len,
                              .scale = 1.0f / std::sqrt(static_cast<float>(head_dim)),
                              .kernel = wgmma ? PrefillKernel::kWgmma : PrefillKernel::kMmaSync};
  state.SetLabel(std::string(fp8 ? "fp8" : "bf16") + (wgmma ? " wgmma" : " mma.sync"));
  const absl::Status status = LaunchPagedPrefillAttention(args, nullptr);  // Warm-up.
  if (!status.ok() || cudaDeviceSynchronize() != cudaSuccess) {
    state.SkipWithError(status.ok() ? "kernel failed" : std::string(status.message()).c_str());
  } else {
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    for (auto _ : state) {
      cudaEventRecord(start, nullptr);
      for (int i = 0; i < kLaunchesPerIteration; ++i) {
        (void)LaunchPagedPrefillAttention(args, nullptr);
      }
      cudaEventRecord(stop, nullptr);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      state.SetIterationTime(ms / 1e3 / kLaunchesPerIteration);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    const double flops = 2.0 * len * static_cast<double>(len) * kNumQHeads * head_dim;
    state.counters["TFLOP/s"] =
        benchmark::Counter(flops / 1e12 * state.iterations(), benchmark::Counter::kIsRate);
    // Ratio of TFLOP/s to the datasheet peak, as a rate so it divides by time.
    state.counters["peak_ratio"] = benchmark::Counter(
        flops / 1e12 / kPeakTflops * state.iterations(), benchmark::Counter::kIsRate);
  }
  for (void* p : {d_cache, d_q, d_out, d_table, d_context, d_query, d_start}) cudaFree(p);
}

// Lengths at head_dim 128 (the Llama shape) on both kernels (Hopper's wgmma
// one and the mma.sync one), and the other common head dims (80 and 96 on
// the 128-wide tiles with the rest masked; 256 on its own) at 8192; the FP8
// cache at head_dim 128 on both kernels; all in blocks of 16 tokens. Then
// Hopper's kernel over larger blocks (fewer, larger tensor copies).
BENCHMARK(BM_PagedPrefillCausal)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->ArgNames({"len", "head_dim", "fp8", "wgmma", "block"})
    ->ArgsProduct({{512, 1024, 2048, 4096, 8192, 16384}, {128}, {0}, {0, 1}, {16}})
    ->Args({8192, 64, 0, 0, 16})
    ->Args({8192, 80, 0, 0, 16})
    ->Args({8192, 96, 0, 0, 16})
    ->Args({8192, 256, 0, 0, 16})
    ->ArgsProduct({{1024, 4096, 8192, 16384}, {128}, {1}, {0, 1}, {16}})
    ->ArgsProduct({{4096, 8192, 16384}, {128}, {0}, {1}, {32, 64, 128}});

}  // namespace
}  // namespace trident::kernels::cuda
