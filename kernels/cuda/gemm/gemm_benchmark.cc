// bf16 GEMMs on the Llama-3-8B layer and head shapes: TFLOP/s, and the
// weight-read GB/s against the read ceiling (a kernel that only reads,
// kernels/cuda/testing) measured in the same run. The weights rotate over
// enough copies (>= 256 MiB in all) that no call finds its weights in L2,
// as in a forward pass. Output mode 0: bf16 y; 1: fp32 y accumulated into
// (the CUDA backend's projections); 2: fp32 y written (the LM head's
// logits). Path 0: cuBLASLt; 1: the
// register-streaming GEMV kernel (m = 1, k <= 8192; cuBLASLt beyond); 2:
// the same with programmatic dependent launch, where each call loads its
// first weights while the previous one ends (as after the norms and the
// activation in a forward pass); 3 and 4: Hopper's bulk-copy GEMV (sm_90,
// any k), plain and with programmatic dependent launch; 5 and 6: Hopper's
// skinny GEMM (2-64 rows, sm_90, programmatic dependent launch) in tiles of
// 128 W rows and of 64; 7: 128-row tiles, split in clusters where the tiles
// fit one wave; 8: cuBLASLt with its candidates timed (GemmOptions::tune_algos,
// 16), the shape first planned inside a graph capture as the backend's
// decode graphs do. Paths 0-4 keep 2-64 rows on cuBLASLt. BM_GemvFused times
// the single-row GEMV with the norm, RoPE and KV append it fuses.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "benchmark/benchmark.h"
#include "common/numeric/dtype.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/testing/device_timer.h"
#include "kernels/cuda/testing/read_ceiling.h"

namespace trident::kernels::cuda {
namespace {

// The weights in rotating copies, a stream, its events, and the read
// ceiling over every copy, measured once.
class WeightRig {
 public:
  explicit WeightRig(int64_t w_bytes)
      : w_bytes_(w_bytes),
        copies_(std::max<int64_t>(1, ((int64_t{256} << 20) + w_bytes - 1) / w_bytes)) {
    cudaMalloc(&w_, w_bytes_ * copies_);
    cudaMemset(w_, 0, w_bytes_ * copies_);
    cudaMalloc(reinterpret_cast<void**>(&sink_), sizeof(unsigned));
    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    cudaEventCreate(&start_);
    cudaEventCreate(&stop_);
    LaunchReadCeiling(w_, w_bytes_ * copies_, sink_, stream_);
    cudaEventRecord(start_, stream_);
    for (int i = 0; i < 5; ++i) LaunchReadCeiling(w_, w_bytes_ * copies_, sink_, stream_);
    cudaEventRecord(stop_, stream_);
    cudaEventSynchronize(stop_);
    float ms = 0;
    cudaEventElapsedTime(&ms, start_, stop_);
    ceiling_gbps_ = 5.0 * w_bytes_ * copies_ / (ms * 1e-3) / 1e9;
  }
  ~WeightRig() {
    cudaFree(w_);
    cudaFree(sink_);
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
    cudaStreamDestroy(stream_);
  }

  const void* weights(int i) const {
    return static_cast<const char*>(w_) + (i % copies_) * w_bytes_;
  }
  cudaStream_t stream() const { return stream_; }

  // Times ten calls of call(weights(i), stream) per iteration with CUDA
  // events, and sets the weight GB/s counters; returns seconds per call.
  template <typename Call>
  double Time(benchmark::State& state, Call call) {
    double total_ms = 0;
    for (auto _ : state) {
      cudaEventRecord(start_, stream_);
      for (int i = 0; i < 10; ++i) call(weights(i), stream_);
      cudaEventRecord(stop_, stream_);
      cudaEventSynchronize(stop_);
      float ms = 0;
      cudaEventElapsedTime(&ms, start_, stop_);
      state.SetIterationTime(ms * 1e-3 / 10);
      total_ms += ms / 10;
    }
    const double per_call_s = total_ms * 1e-3 / state.iterations();
    const double gbps = w_bytes_ / per_call_s / 1e9;
    state.counters["weight_GBps"] = gbps;
    state.counters["ceiling_GBps"] = ceiling_gbps_;
    state.counters["vs_ceiling"] = gbps / ceiling_gbps_;
    state.counters["weight_copies"] = static_cast<double>(copies_);
    return per_call_s;
  }

 private:
  int64_t w_bytes_;
  int64_t copies_;
  void* w_ = nullptr;
  unsigned* sink_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  double ceiling_gbps_ = 0;
};

void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const int64_t mode = state.range(3);
  const int64_t path = state.range(4);
  auto gemm = Gemm::Create({.gemv = path != 0 && path != 8,
                            .pdl = path == 2 || (path >= 4 && path != 8),
                            .gemv_bulk = path >= 3,
                            .skinny = path >= 5 && path != 8,
                            .skinny_tile_rows = path == 6 ? 64 : 128,
                            .skinny_cluster_split = path == 7,
                            .tune_algos = path == 8 ? 16 : 0});
  if (!gemm.ok()) {
    state.SkipWithError(std::string(gemm.status().message()).c_str());
    return;
  }
  WeightRig rig(n * k * 2);
  void *x, *y;
  cudaMalloc(&x, m * k * 2);
  cudaMalloc(&y, m * n * 4);
  cudaMemset(x, 0, m * k * 2);
  cudaMemset(y, 0, m * n * 4);
  GemmArgs args{x, k, rig.weights(0), nullptr, y, n, m, n, k};
  if (mode >= 1) {
    args.y_dtype = numeric::DType::kF32;
    args.accumulate = mode == 1;
  }
  if (path == 8) {
    // Planned (and so timed) inside a capture; the graph is not replayed.
    testing::GraphTimer capture(1, [&](cudaStream_t stream) { (void)(*gemm)->Run(args, stream); });
    state.counters["tuned_off_first"] = (*gemm)->tune_stats().changed;
  }
  (void)(*gemm)->Run(args, rig.stream());
  const double per_call_s = rig.Time(state, [&](const void* w, cudaStream_t stream) {
    args.w = w;
    (void)(*gemm)->Run(args, stream);
  });
  state.counters["TFLOPs"] = 2.0 * m * n * k / per_call_s / 1e12;
  state.counters["cluster"] = (*gemm)->SkinnyClusterSize(args);  // CTAs per cluster, 0: none
  cudaFree(x);
  cudaFree(y);
}

// The gate/up projection with SwiGLU's activation fused (Gemm::RunSiluMul:
// Hopper's GEMV for one row, its skinny GEMM for more), against the same
// run's ceiling: the fused call writes bf16 silu(g) * u instead of the f32
// gate/up rows.
void BM_GemvSiluMul(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1), m = state.range(2);
  auto gemm = Gemm::Create({.skinny = true});
  if (!gemm.ok()) {
    state.SkipWithError(std::string(gemm.status().message()).c_str());
    return;
  }
  WeightRig rig(n * k * 2);
  void *x, *y;
  cudaMalloc(&x, m * k * 2);
  cudaMalloc(&y, m * n);
  cudaMemset(x, 0, m * k * 2);
  GemmArgs args{x, k, rig.weights(0), nullptr, y, n / 2, m, n, k};
  if ((*gemm)->FusesSiluMul(args)) {
    rig.Time(state, [&](const void* w, cudaStream_t stream) {
      args.w = w;
      (void)(*gemm)->RunSiluMul(args, stream);
    });
  } else {
    state.SkipWithError("the fused projection needs an sm_90 device");
  }
  cudaFree(x);
  cudaFree(y);
}
BENCHMARK(BM_GemvSiluMul)
    ->ArgNames({"n", "k", "m"})
    ->Args({28672, 4096, 1})
    ->Args({28672, 4096, 16})
    ->Args({28672, 4096, 64})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// One token's q/k/v and gate/up on Hopper's GEMV with what it fuses, each
// against the same run's ceiling. Fusion 0: the plain projection (q/k/v
// into f32, gate/up with SwiGLU); 1: the RMSNorm ahead of it fused (x is
// the f32 residual); 2 (q/k/v only): also RoPE and the KV append in its
// epilogue (Gemm::RunRope). The weights' bytes are what the figures count.
void BM_GemvFused(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1), fusion = state.range(2);
  const bool silu = n > 8192;
  auto gemm = Gemm::Create();
  if (!gemm.ok()) {
    state.SkipWithError(std::string(gemm.status().message()).c_str());
    return;
  }
  WeightRig rig(n * k * 2);
  constexpr int32_t kHeadDim = 128, kKvHeads = 8, kBlocks = 4, kBlockSize = 16;
  const int32_t q_heads = static_cast<int32_t>(n / kHeadDim) - 2 * kKvHeads;
  const int64_t cache_elems = int64_t{kBlocks} * 2 * kKvHeads * kBlockSize * kHeadDim;
  void *x, *y, *norm, *freq, *position, *slot, *cache;
  cudaMalloc(&x, k * 4);
  cudaMalloc(&y, n * 4);
  cudaMalloc(&norm, k * 4);
  cudaMalloc(&freq, kHeadDim / 2 * 4);
  cudaMalloc(&position, 4);
  cudaMalloc(&slot, 8);
  cudaMalloc(&cache, cache_elems * 2);
  cudaMemset(x, 0, k * 4);
  cudaMemset(norm, 0, k * 4);
  cudaMemset(freq, 0, kHeadDim / 2 * 4);
  cudaMemset(position, 0, 4);
  cudaMemset(slot, 0, 8);
  GemmArgs args{x, k, rig.weights(0), nullptr, y, silu ? n / 2 : n, 1, n, k};
  args.y_dtype = silu || fusion == 2 ? numeric::DType::kBF16 : numeric::DType::kF32;
  if (fusion >= 1) {
    args.norm_weight = static_cast<const float*>(norm);
    args.norm_eps = 1e-5f;
  }
  const GemmRope rope{static_cast<const int32_t*>(position),
                      static_cast<const float*>(freq),
                      q_heads,
                      kKvHeads,
                      kHeadDim,
                      {cache, kBlocks, kBlockSize, kKvHeads, kHeadDim, cache_elems / kBlocks,
                       cache_elems / kBlocks / 2},
                      static_cast<const int64_t*>(slot)};
  auto call = [&](cudaStream_t stream) {
    if (silu) return (*gemm)->RunSiluMul(args, stream);
    if (fusion == 2) return (*gemm)->RunRope(args, rope, stream);
    return (*gemm)->Run(args, stream);
  };
  if (absl::Status status = call(rig.stream()); !status.ok()) {
    state.SkipWithError(std::string(status.message()).c_str());
  } else {
    rig.Time(state, [&](const void* w, cudaStream_t stream) {
      args.w = w;
      (void)call(stream);
    });
  }
  for (void* p : {x, y, norm, freq, position, slot, cache}) cudaFree(p);
}
BENCHMARK(BM_GemvFused)
    ->ArgNames({"n", "k", "fusion"})
    ->Args({6144, 4096, 0})
    ->Args({6144, 4096, 1})
    ->Args({6144, 4096, 2})
    ->Args({28672, 4096, 0})
    ->Args({28672, 4096, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void Shapes(benchmark::internal::Benchmark* b) {
  for (int64_t mode : {0, 1, 2}) {
    for (int64_t m : {1, 2, 4, 8, 16, 24, 32, 48, 64, 512, 4096}) {
      for (int64_t path : {0, 1, 2, 3, 4, 5, 6, 7, 8}) {
        if (m > 1 && path >= 1 && path <= 4) continue;
        if ((m == 1 || m > 64) && path >= 5 && path <= 7) continue;
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
