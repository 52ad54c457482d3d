// Bandwidth of the fused residual add + RMSNorm (and plain RMSNorm) against a
// device-to-device copy moving the same bytes, measured in the same run: the
// copy's GB/s is the ceiling the kernels' GB/s are read against.
//
// AddRmsNorm moves 12 bytes an element (fp32 residual read and written, bf16
// delta read, bf16 out written); RmsNorm from the fp32 residual moves 6.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "benchmark/benchmark.h"
#include "common/numeric/dtype.h"
#include "kernels/cuda/rms_norm/rms_norm.h"
#include "kernels/cuda/testing/device_timer.h"

namespace trident::kernels::cuda {
namespace {

struct Buffers {
  Buffers(int64_t rows, int64_t dim) : elems(static_cast<size_t>(rows * dim)) {
    cudaMalloc(&residual, elems * 4);
    cudaMalloc(&delta, elems * 2);
    cudaMalloc(&out, elems * 2);
    cudaMalloc(&weight, static_cast<size_t>(dim) * 4);
    cudaMalloc(&copy_src, elems * 6);
    cudaMalloc(&copy_dst, elems * 6);
    cudaMemset(residual, 0, elems * 4);
    cudaMemset(delta, 0, elems * 2);
    cudaMemset(weight, 0, static_cast<size_t>(dim) * 4);
  }
  ~Buffers() {
    cudaFree(residual);
    cudaFree(delta);
    cudaFree(out);
    cudaFree(weight);
    cudaFree(copy_src);
    cudaFree(copy_dst);
  }
  size_t elems;
  void* residual = nullptr;
  void* delta = nullptr;
  void* out = nullptr;
  void* weight = nullptr;
  void* copy_src = nullptr;
  void* copy_dst = nullptr;
};

void BM_AddRmsNorm(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const int64_t dim = state.range(1);
  Buffers b(rows, dim);
  const AddRmsNormArgs args{.residual = static_cast<float*>(b.residual),
                            .residual_stride = dim,
                            .delta = b.delta,
                            .delta_stride = dim,
                            .weight = static_cast<const float*>(b.weight),
                            .out = b.out,
                            .out_stride = dim,
                            .rows = rows,
                            .dim = dim};
  testing::TimeOnDevice(state, b.elems * 12, [&] { (void)LaunchAddRmsNorm(args, nullptr); });
}

void BM_RmsNormF32In(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const int64_t dim = state.range(1);
  Buffers b(rows, dim);
  const RmsNormArgs args{.x = b.residual,
                         .x_dtype = numeric::DType::kF32,
                         .x_stride = dim,
                         .weight = static_cast<const float*>(b.weight),
                         .out = b.out,
                         .out_stride = dim,
                         .rows = rows,
                         .dim = dim};
  testing::TimeOnDevice(state, b.elems * 6, [&] { (void)LaunchRmsNorm(args, nullptr); });
}

// A copy of 6 bytes an element moves 12: the AddRmsNorm ceiling.
void BM_CopyCeiling12BytesPerElement(benchmark::State& state) {
  Buffers b(state.range(0), state.range(1));
  testing::TimeOnDevice(state, b.elems * 12, [&] {
    cudaMemcpyAsync(b.copy_dst, b.copy_src, b.elems * 6, cudaMemcpyDeviceToDevice);
  });
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->UseManualTime()->Args({1, 4096})->Args({64, 4096})->Args({4096, 4096})->Args({4096, 5120});
}
BENCHMARK(BM_AddRmsNorm)->Apply(Shapes);
BENCHMARK(BM_RmsNormF32In)->Apply(Shapes);
BENCHMARK(BM_CopyCeiling12BytesPerElement)->Apply(Shapes);

}  // namespace
}  // namespace trident::kernels::cuda
