// Time per launch of the GPU sampler over a 128256-token vocabulary, greedy
// and top_k 50 + top_p 0.9, for 1 to 256 rows of f32 or bf16 logits. Bytes
// processed are the logits read once; BM_CopyCeiling times a device-to-device
// copy of the same logits in the same run and counts its read and write
// traffic, so the two GB/s figures are both DRAM bandwidth: the sampler's
// ratio to the copy's is how close it gets to streaming its input once.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/numeric/dtype.h"
#include "kernels/cuda/sampling/sampling.h"
#include "kernels/cuda/sampling/sampling_row.h"
#include "kernels/cuda/testing/device_timer.h"

namespace trident::kernels::cuda {
namespace {

constexpr int32_t kVocab = 128256;

enum Mode : int64_t { kGreedy = 0, kTopKTopP = 1 };

// Device buffers of one launch, filled once, freed on destruction.
struct Launch {
  Launch(int64_t rows, Mode mode, numeric::DType dtype) {
    const size_t count = static_cast<size_t>(rows) * kVocab;
    logits_bytes = count * numeric::ElementSize(dtype);
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<uint8_t> host(logits_bytes);
    for (size_t i = 0; i < count; ++i) {
      const float x = normal(rng);
      if (dtype == numeric::DType::kF32) {
        std::memcpy(host.data() + 4 * i, &x, 4);
      } else {
        const uint16_t bits = numeric::FloatToBf16(x);
        std::memcpy(host.data() + 2 * i, &bits, 2);
      }
    }
    std::vector<SamplingRow> host_rows(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      SamplingRow& row = host_rows[static_cast<size_t>(r)];
      if (mode == kGreedy) {
        row.temperature = 0.0f;
      } else {
        row.top_k = 50;
        row.top_p = 0.9f;
      }
      row.seed = static_cast<uint64_t>(r) * 0x9E3779B97F4A7C15ull;
      row.output_position = 100;
    }
    workspace_bytes = SampleWorkspaceBytes(rows, kVocab);
    cudaMalloc(&logits, logits_bytes);
    cudaMalloc(&copy, logits_bytes);
    cudaMalloc(&params, rows * sizeof(SamplingRow));
    cudaMalloc(&tokens, rows * sizeof(int32_t));
    cudaMalloc(&workspace, workspace_bytes);
    cudaMemcpy(logits, host.data(), logits_bytes, cudaMemcpyHostToDevice);
    cudaMemcpy(params, host_rows.data(), rows * sizeof(SamplingRow), cudaMemcpyHostToDevice);
    args = SampleArgs{
        .logits = logits,
        .logits_dtype = dtype,
        .logits_stride = kVocab,
        .rows = rows,
        .vocab = kVocab,
        .params = static_cast<const SamplingRow*>(params),
        .tokens = static_cast<int32_t*>(tokens),
        .workspace = workspace,
        .workspace_bytes = workspace_bytes,
    };
  }
  ~Launch() {
    cudaFree(logits);
    cudaFree(copy);
    cudaFree(params);
    cudaFree(tokens);
    cudaFree(workspace);
  }
  size_t logits_bytes = 0;
  size_t workspace_bytes = 0;
  void* logits = nullptr;
  void* copy = nullptr;
  void* params = nullptr;
  void* tokens = nullptr;
  void* workspace = nullptr;
  SampleArgs args;
};

numeric::DType DTypeArg(int64_t arg) {
  return arg == 0 ? numeric::DType::kF32 : numeric::DType::kBF16;
}

void BM_Sample(benchmark::State& state) {
  Launch launch(state.range(0), static_cast<Mode>(state.range(1)), DTypeArg(state.range(2)));
  if (!LaunchSample(launch.args, nullptr).ok()) {
    state.SkipWithError("LaunchSample failed");
    return;
  }
  testing::TimeOnDevice(state, launch.logits_bytes,
                        [&] { (void)LaunchSample(launch.args, nullptr); });
}

void BM_CopyCeiling(benchmark::State& state) {
  Launch launch(state.range(0), kGreedy, DTypeArg(state.range(2)));
  testing::TimeOnDevice(state, 2 * launch.logits_bytes, [&] {
    cudaMemcpyAsync(launch.copy, launch.logits, launch.logits_bytes, cudaMemcpyDeviceToDevice);
  });
}

// Args: rows, mode (0 greedy, 1 top_k 50 + top_p 0.9), dtype (0 f32, 1 bf16).
void SampleArgsGrid(benchmark::internal::Benchmark* b) {
  for (const int64_t dtype : {0, 1}) {
    for (const int64_t mode : {kGreedy, kTopKTopP}) {
      for (const int64_t rows : {1, 16, 64, 256}) b->Args({rows, mode, dtype});
    }
  }
}

void CopyArgsGrid(benchmark::internal::Benchmark* b) {
  for (const int64_t dtype : {0, 1}) {
    for (const int64_t rows : {1, 16, 64, 256}) b->Args({rows, 0, dtype});
  }
}

BENCHMARK(BM_Sample)->UseManualTime()->Apply(SampleArgsGrid);
BENCHMARK(BM_CopyCeiling)->UseManualTime()->Apply(CopyArgsGrid);

}  // namespace
}  // namespace trident::kernels::cuda
