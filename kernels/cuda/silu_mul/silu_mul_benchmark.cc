// Bandwidth of the bf16 SiLU·mul kernel against a device-to-device copy,
// measured in the same run: the copy's GB/s is the ceiling the kernel's GB/s
// is read against.

#include <cuda_runtime_api.h>

#include "benchmark/benchmark.h"
#include "kernels/cuda/silu_mul/silu_mul.h"
#include "kernels/cuda/testing/device_timer.h"

namespace trident::kernels::cuda {
namespace {

// Device buffers for a (tokens, hidden) problem, freed on destruction.
struct Buffers {
  Buffers(int64_t tokens, int64_t hidden)
      : in_bytes(static_cast<size_t>(tokens * 2 * hidden * 2)),
        out_bytes(static_cast<size_t>(tokens * hidden * 2)) {
    cudaMalloc(&in, in_bytes);
    cudaMalloc(&out, in_bytes);
    cudaMemset(in, 0, in_bytes);
  }
  ~Buffers() {
    cudaFree(in);
    cudaFree(out);
  }
  size_t in_bytes;
  size_t out_bytes;
  void* in = nullptr;
  void* out = nullptr;
};

void BM_SiluMul(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int64_t hidden = state.range(1);
  Buffers buffers(tokens, hidden);
  const SiluMulArgs args{.gate_up = buffers.in,
                         .gate_up_stride = 2 * hidden,
                         .out = buffers.out,
                         .out_stride = hidden,
                         .num_tokens = tokens,
                         .hidden = hidden};
  testing::TimeOnDevice(state, buffers.in_bytes + buffers.out_bytes,
                        [&] { (void)LaunchSiluMul(args, nullptr); });
}

void BM_CopyCeiling(benchmark::State& state) {
  Buffers buffers(state.range(0), state.range(1));
  // Reads and writes the kernel's input size: 2 * in_bytes moved a launch.
  testing::TimeOnDevice(state, 2 * buffers.in_bytes, [&] {
    cudaMemcpyAsync(buffers.out, buffers.in, buffers.in_bytes, cudaMemcpyDeviceToDevice);
  });
}

BENCHMARK(BM_SiluMul)->UseManualTime()->Args({1, 14336})->Args({64, 14336})->Args({4096, 14336});
BENCHMARK(BM_CopyCeiling)
    ->UseManualTime()
    ->Args({1, 14336})
    ->Args({64, 14336})
    ->Args({4096, 14336});

}  // namespace
}  // namespace trident::kernels::cuda
