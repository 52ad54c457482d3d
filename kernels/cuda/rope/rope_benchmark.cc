// Bandwidth of in-place bf16 RoPE on a fused qkv buffer (q and k heads read
// and written) against a device-to-device copy moving the same bytes, measured
// in the same run: the copy's GB/s is the ceiling the kernel's is read against.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/rope/rope.h"
#include "kernels/cuda/rope/rope.h"
#include "kernels/cuda/testing/device_timer.h"

namespace trident::kernels::cuda {
namespace {

// Llama-3-8B: 32 q heads, 8 kv heads of 128.
constexpr int32_t kQHeads = 32;
constexpr int32_t kKvHeads = 8;
constexpr int32_t kHeadDim = 128;
constexpr int64_t kWidth = (kQHeads + 2 * kKvHeads) * kHeadDim;
constexpr int64_t kRotated = (kQHeads + kKvHeads) * kHeadDim;

void BM_Rope(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  cpu::RopeConfig config;
  config.head_dim = kHeadDim;
  config.theta = 500000.0;
  config.llama3_scaling = true;
  const std::vector<float> inv_freq = cpu::RopeInvFreq(config);
  std::vector<int32_t> positions(tokens);
  for (int64_t t = 0; t < tokens; ++t) positions[t] = static_cast<int32_t>(t * 7);
  void* qkv = nullptr;
  int32_t* d_positions = nullptr;
  float* d_inv_freq = nullptr;
  cudaMalloc(&qkv, static_cast<size_t>(tokens * kWidth * 2));
  cudaMemset(qkv, 0, static_cast<size_t>(tokens * kWidth * 2));
  cudaMalloc(reinterpret_cast<void**>(&d_positions), positions.size() * 4);
  cudaMalloc(reinterpret_cast<void**>(&d_inv_freq), inv_freq.size() * 4);
  cudaMemcpy(d_positions, positions.data(), positions.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_inv_freq, inv_freq.data(), inv_freq.size() * 4, cudaMemcpyHostToDevice);
  uint16_t* base = static_cast<uint16_t*>(qkv);
  const RopeArgs args{.q = base,
                      .q_token_stride = kWidth,
                      .num_q_heads = kQHeads,
                      .k = base + kQHeads * kHeadDim,
                      .k_token_stride = kWidth,
                      .num_kv_heads = kKvHeads,
                      .head_dim = kHeadDim,
                      .positions = d_positions,
                      .num_tokens = tokens,
                      .inv_freq = d_inv_freq};
  testing::TimeOnDevice(state, static_cast<size_t>(tokens * kRotated * 2 * 2),
                        [&] { (void)LaunchRope(args, nullptr); });
  cudaFree(qkv);
  cudaFree(d_positions);
  cudaFree(d_inv_freq);
}

void BM_CopyCeiling(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0) * kRotated * 2);
  void* src = nullptr;
  void* dst = nullptr;
  cudaMalloc(&src, bytes);
  cudaMalloc(&dst, bytes);
  testing::TimeOnDevice(state, 2 * bytes,
                        [&] { cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice); });
  cudaFree(src);
  cudaFree(dst);
}

BENCHMARK(BM_Rope)->UseManualTime()->Arg(1)->Arg(64)->Arg(4096);
BENCHMARK(BM_CopyCeiling)->UseManualTime()->Arg(1)->Arg(64)->Arg(4096);

}  // namespace
}  // namespace trident::kernels::cuda
