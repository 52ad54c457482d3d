// Decode attention with the output projection fused
// (LaunchPagedDecodeAttentionO) against the two kernels it replaces, one
// sequence of the Llama-3-8B shape (32 q heads, 8 kv heads, head_dim 128,
// hidden 4096): the cluster attention kernel and Hopper's GEMV over W_o
// (kernels/cuda/gemm, accumulating into the f32 residual), launched back to
// back with programmatic dependent launch, each alone, and the fused one.
// Launches are captured into a CUDA graph and timed as one. Bytes: W_o's
// 32 MiB plus the context's K and V; the ceiling is the read probe over a
// buffer of the same size, in the same run.
//
// Modes (the benchmark's second argument): 0 fused, 1 attention then GEMV,
// 2 attention alone, 3 GEMV alone.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/paged_decode_attention/paged_decode_attention.h"
#include "kernels/cuda/testing/device_timer.h"
#include "kernels/cuda/testing/read_ceiling.h"

namespace trident::kernels::cuda {
namespace {

constexpr int kLaunches = 20;
constexpr int32_t kQHeads = 32;
constexpr int32_t kKvHeads = 8;
constexpr int32_t kHeadDim = 128;
constexpr int32_t kHidden = 4096;
constexpr int32_t kBlockSize = 16;

class Buffers {
 public:
  ~Buffers() {
    for (void* p : owned_) cudaFree(p);
  }
  void* Zeroed(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    owned_.push_back(p);
    cudaMemset(p, 0, bytes);
    return p;
  }

 private:
  std::vector<void*> owned_;
};

void BM_DecodeAttentionO(benchmark::State& state) {
  const int32_t context = static_cast<int32_t>(state.range(0));
  const int mode = static_cast<int>(state.range(1));
  if (!DecodeOProjectionSupported(kQHeads, kKvHeads, kHeadDim)) {
    state.SkipWithError("needs an sm_90 device");
    return;
  }
  Buffers buffers;
  const int32_t blocks = (context + kBlockSize - 1) / kBlockSize;
  const int64_t block_elems = int64_t{2} * kKvHeads * kBlockSize * kHeadDim;
  const size_t kv_bytes = static_cast<size_t>(blocks) * block_elems * 2;
  const size_t w_bytes = size_t{kHidden} * kQHeads * kHeadDim * 2;
  void* cache = buffers.Zeroed(kv_bytes);
  void* q = buffers.Zeroed(kQHeads * kHeadDim * 2);
  void* out = buffers.Zeroed(kQHeads * kHeadDim * 2);
  void* weight = buffers.Zeroed(w_bytes);
  void* residual = buffers.Zeroed(kHidden * 4);
  const size_t ws_bytes = DecodeOProjectionWorkspaceBytes(kKvHeads, kHidden);
  void* workspace = buffers.Zeroed(ws_bytes);
  auto* table = static_cast<int32_t*>(buffers.Zeroed(blocks * 4));
  auto* lens = static_cast<int32_t*>(buffers.Zeroed(4));
  auto* sink = static_cast<unsigned*>(buffers.Zeroed(4096));
  void* probe = buffers.Zeroed(w_bytes + kv_bytes);
  if (probe == nullptr || cache == nullptr || weight == nullptr) {
    state.SkipWithError("cudaMalloc failed");
    return;
  }
  std::vector<int32_t> host_table(blocks);
  for (int32_t b = 0; b < blocks; ++b) host_table[b] = b;
  cudaMemcpy(table, host_table.data(), blocks * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(lens, &context, 4, cudaMemcpyHostToDevice);
  auto gemm = Gemm::Create();
  if (!gemm.ok()) {
    state.SkipWithError(gemm.status().ToString().c_str());
    return;
  }
  const PagedDecodeArgs args{.q = q,
                             .q_stride = kQHeads * kHeadDim,
                             .out = out,
                             .out_stride = kQHeads * kHeadDim,
                             .kv_base = cache,
                             .block_stride_elems = block_elems,
                             .value_offset_elems = block_elems / 2,
                             .block_size = kBlockSize,
                             .num_q_heads = kQHeads,
                             .num_kv_heads = kKvHeads,
                             .head_dim = kHeadDim,
                             .block_tables = table,
                             .max_blocks_per_seq = blocks,
                             .context_lens = lens,
                             .batch = 1,
                             .scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim)),
                             .pdl = true,
                             .stable_prefix = true};
  const DecodeOProjection o{.weight = weight,
                            .weight_stride = kQHeads * kHeadDim,
                            .residual = static_cast<float*>(residual),
                            .hidden = kHidden,
                            .workspace = workspace,
                            .workspace_bytes = ws_bytes};
  GemmArgs g{out,     kQHeads * kHeadDim, weight, nullptr, residual, kHidden, 1,
             kHidden, kQHeads * kHeadDim};
  g.y_dtype = numeric::DType::kF32;
  g.accumulate = true;
  const DecodePlan plan{kDecodeOSplits, kClusterDecodeVariant};
  bool failed = false;
  testing::GraphTimer timer(kLaunches, [&](cudaStream_t stream) {
    if (mode == 0) {
      failed |= !LaunchPagedDecodeAttentionO(args, o, stream).ok();
      return;
    }
    if (mode != 3) failed |= !LaunchPagedDecodeAttention(args, plan, nullptr, 0, stream).ok();
    if (mode != 2) failed |= !(*gemm)->Run(g, stream).ok();
  });
  if (!timer.ok() || failed) {
    state.SkipWithError("launch or capture failed");
    return;
  }
  float ceiling_ms = 1e30f;
  for (int i = 0; i < 6; ++i) {
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaEventRecord(start, nullptr);
    (void)LaunchReadCeiling(probe, w_bytes + kv_bytes, sink, nullptr);
    cudaEventRecord(stop, nullptr);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i > 0) ceiling_ms = std::min(ceiling_ms, ms);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  timer.Time();  // Warmup.
  double total_ms = 0;
  for (auto _ : state) {
    const float ms = timer.Time();
    total_ms += ms;
    state.SetIterationTime(ms / 1e3);
  }
  if (cudaDeviceSynchronize() != cudaSuccess) state.SkipWithError("kernel failed");
  const double us = 1e3 * total_ms / std::max<int64_t>(1, state.iterations());
  state.counters["us"] = us;
  state.counters["ceiling_us"] = 1e3 * ceiling_ms;
  state.counters["of_ceiling"] = 1e3 * ceiling_ms / us;
  state.counters["parts"] = DecodeOProjectionParts(kKvHeads, kHidden);
}

BENCHMARK(BM_DecodeAttentionO)
    ->ArgsProduct({{512, 2048}, {0, 1, 2, 3}})
    ->ArgNames({"context", "mode"})
    ->UseManualTime()
    ->Iterations(20);

}  // namespace
}  // namespace trident::kernels::cuda
