// bf16 GEMMs on the Llama-3-8B layer and head shapes: TFLOP/s, and the
// weight-read GB/s against the read ceiling (a kernel that only reads,
// kernels/cuda/testing) measured in the same run. The weights rotate over
// enough copies (>= 256 MiB in all) that no call finds its weights in L2,
// as in a forward pass. Output mode 0: bf16 y; 1: fp32 y accumulated into
// (the CUDA backend's projections). Path 0: cuBLASLt; 1: the
// register-streaming GEMV kernel (m = 1, k <= 8192; cuBLASLt beyond); 2:
// the same with programmatic dependent launch, where each call loads its
// first weights while the previous one ends (as after the norms and the
// activation in a forward pass); 3 and 4: Hopper's bulk-copy GEMV (sm_90,
// any k), plain and with programmatic dependent launch.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/numeric/dtype.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/testing/read_ceiling.h"

namespace trident::kernels::cuda {
namespace {

void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool f32_out = state.range(3) == 1;
  const int64_t path = state.range(4);
  const int64_t w_bytes = n * k * 2;
  const int64_t copies = std::max<int64_t>(1, ((int64_t{256} << 20) + w_bytes - 1) / w_bytes);
  void *x, *w, *y;
  unsigned* sink;
  cudaMalloc(&x, m * k * 2);
  cudaMalloc(&w, w_bytes * copies);
  cudaMalloc(&y, m * n * 4);
  cudaMalloc(reinterpret_cast<void**>(&sink), sizeof(unsigned));
  cudaMemset(x, 0, m * k * 2);
  cudaMemset(w, 0, w_bytes * copies);
  cudaMemset(y, 0, m * n * 4);
  auto gemm =
      Gemm::Create({.gemv = path != 0, .pdl = path == 2 || path == 4, .gemv_bulk = path >= 3});
  if (!gemm.ok()) {
    state.SkipWithError(std::string(gemm.status().message()).c_str());
    return;
  }
  GemmArgs args{x, k, w, nullptr, y, n, m, n, k};
  if (f32_out) {
    args.y_dtype = numeric::DType::kF32;
    args.accumulate = true;
  }
  auto weights = [&](int i) { return static_cast<const char*>(w) + (i % copies) * w_bytes; };
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  // The ceiling: reading every copy of the weights once.
  LaunchReadCeiling(w, w_bytes * copies, sink, stream);
  cudaEventRecord(start, stream);
  for (int i = 0; i < 5; ++i) LaunchReadCeiling(w, w_bytes * copies, sink, stream);
  cudaEventRecord(stop, stream);
  cudaEventSynchronize(stop);
  float ceiling_ms = 0;
  cudaEventElapsedTime(&ceiling_ms, start, stop);
  const double ceiling_gbps = 5.0 * w_bytes * copies / (ceiling_ms * 1e-3) / 1e9;
  (void)(*gemm)->Run(args, stream);
  double total_ms = 0;
  for (auto _ : state) {
    cudaEventRecord(start, stream);
    for (int i = 0; i < 10; ++i) {
      args.w = weights(i);
      (void)(*gemm)->Run(args, stream);
    }
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms * 1e-3 / 10);
    total_ms += ms / 10;
  }
  const double per_call_s = total_ms * 1e-3 / state.iterations();
  state.counters["TFLOPs"] = 2.0 * m * n * k / per_call_s / 1e12;
  state.counters["weight_GBps"] = n * k * 2.0 / per_call_s / 1e9;
  state.counters["ceiling_GBps"] = ceiling_gbps;
  state.counters["vs_ceiling"] = n * k * 2.0 / per_call_s / 1e9 / ceiling_gbps;
  state.counters["weight_copies"] = static_cast<double>(copies);
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
  cudaFree(sink);
  cudaStreamDestroy(stream);
}

void Shapes(benchmark::internal::Benchmark* b) {
  for (int64_t mode : {0, 1}) {
    for (int64_t m : {1, 2, 4, 8, 16, 64, 512, 4096}) {
      for (int64_t path : {0, 1, 2, 3, 4}) {
        if (path > 0 && m > 1) continue;
        b->Args({m, 6144, 4096, mode, path});    // fused q/k/v
        b->Args({m, 4096, 4096, mode, path});    // o
        b->Args({m, 28672, 4096, mode, path});   // fused gate/up
        b->Args({m, 4096, 14336, mode, path});   // down
        b->Args({m, 128256, 4096, mode, path});  // head
      }
    }
  }
}
BENCHMARK(BM_Gemm)->Apply(Shapes)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace trident::kernels::cuda
