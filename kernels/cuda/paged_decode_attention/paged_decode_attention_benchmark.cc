// Bandwidth of bf16 paged decode attention (32 q / 8 kv heads, head_dim 128
// unless the row says otherwise, block 16, shuffled block tables) against a
// read-only probe over the same
// K + V bytes, measured in the same run. Bytes = K + V read (q, out and the
// split partials are < 1% of it). One row per (batch, context, variant):
// variant -1 is the default (what PlanDecode and the backend run), 0 the
// legacy kernel, 1.. the tensor-core variants (DecodeVariantName: warps per
// CTA and pipeline stages per warp). Counters per row: GB/s of the kernel,
// ceiling_GB/s of the probe, of_ceiling their ratio, splits chosen by the
// planner for the variant, variant (the index run), ctas_per_sm the planner
// assumed. With fp8 = 1 the cache is FP8 E4M3 (kernels/cpu/paged_kv_fp8's
// layout: a byte per element plus an f32 scale per token, head and K or V),
// and bytes count those; time per step against the bf16 row of the same
// shape is the gain. A positive `splits` replaces the planner's count (the
// batch-1 rows: how many pieces a short context is best cut into); stable
// = 1 launches with stable_prefix (the first chunks copied before each
// launch's wait on the one ahead). Variant -1 takes the backend's plan:
// PlanDecodeAuto's over the bf16 cache, DefaultFp8DecodeVariant's over the
// FP8 one. The
// kernel is timed as the backend runs it: 20 launches (and their merges)
// with programmatic dependent launch, replayed from one CUDA graph, so no
// host launch cost sits between them.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cuda/paged_decode_attention/paged_decode_attention.h"
#include "kernels/cuda/testing/device_timer.h"
#include "kernels/cuda/testing/read_ceiling.h"

namespace trident::kernels::cuda {
namespace {

constexpr int kLaunchesPerIteration = 20;
constexpr int32_t kQHeads = 32;
constexpr int32_t kKvHeads = 8;
constexpr int32_t kBlockSize = 16;

// Milliseconds per launch of `launch`, on the default stream.
template <typename Launch>
float TimeLaunches(int launches, Launch launch) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, nullptr);
  for (int i = 0; i < launches; ++i) launch();
  cudaEventRecord(stop, nullptr);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / launches;
}

void BM_PagedDecodeAttention(benchmark::State& state) {
  const int32_t batch = static_cast<int32_t>(state.range(0));
  const int32_t context = static_cast<int32_t>(state.range(1));
  const int32_t head_dim = static_cast<int32_t>(state.range(3));
  int device = 0;
  int sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const bool fp8 = state.range(4) != 0;
  int32_t variant = static_cast<int32_t>(state.range(2));
  if (variant < 0) {
    variant = fp8 ? DefaultFp8DecodeVariant(batch, kKvHeads, head_dim, sms)
                  : DefaultDecodeVariant(batch, kKvHeads, head_dim, sms);
  }
  const int32_t forced_splits = static_cast<int32_t>(state.range(5));

  const int32_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
  const int64_t half = static_cast<int64_t>(kKvHeads) * kBlockSize * head_dim;  // Elements.
  const int64_t num_blocks = static_cast<int64_t>(batch) * blocks_per_seq;
  // Per block: K and V, and for FP8 the scales (2 x heads x tokens x 4 bytes).
  const int64_t scale_bytes = static_cast<int64_t>(2) * kKvHeads * kBlockSize * 4;
  const int64_t block_bytes = fp8 ? 2 * half + scale_bytes : 2 * half * 2;
  const size_t cache_bytes = static_cast<size_t>(num_blocks * block_bytes);
  const int64_t token_bytes =
      fp8 ? static_cast<int64_t>(kKvHeads) * (2 * head_dim + 8) : int64_t{kKvHeads} * head_dim * 4;
  const size_t kv_bytes = static_cast<size_t>(batch) * context * token_bytes;

  DecodePlan plan = state.range(2) < 0 && !fp8
                        ? PlanDecodeAuto(batch, kKvHeads, head_dim, context, sms)
                        : PlanDecodeVariant(batch, kKvHeads, head_dim, context, sms, variant);
  if (forced_splits > 0) plan.num_splits = forced_splits;
  const bool stable_prefix = state.range(6) != 0;
  const size_t workspace_bytes = DecodeWorkspaceBytes(plan, batch, kQHeads, head_dim);
  state.SetLabel(std::string(DecodeVariantName(plan.variant)) + (fp8 ? " fp8" : " bf16") +
                 (stable_prefix ? " stable_prefix" : ""));

  void* cache = nullptr;
  void* q = nullptr;
  void* out = nullptr;
  void* workspace = nullptr;
  int32_t* tables = nullptr;
  int32_t* lens = nullptr;
  unsigned* sink = nullptr;
  if (cudaMalloc(&cache, cache_bytes) != cudaSuccess ||
      cudaMalloc(&q, static_cast<size_t>(batch) * kQHeads * head_dim * 2) != cudaSuccess ||
      cudaMalloc(&out, static_cast<size_t>(batch) * kQHeads * head_dim * 2) != cudaSuccess ||
      cudaMalloc(&workspace, std::max<size_t>(workspace_bytes, 16)) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&tables), static_cast<size_t>(num_blocks) * 4) !=
          cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&lens), static_cast<size_t>(batch) * 4) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&sink), 4) != cudaSuccess) {
    state.SkipWithError("cudaMalloc failed");
    return;
  }
  // 0x3c3c: bf16 ~0.0115 everywhere, finite scores (FP8: elements 1.5,
  // scales ~0.0115).
  cudaMemset(cache, 0x3c, cache_bytes);
  cudaMemset(q, 0x3c, static_cast<size_t>(batch) * kQHeads * head_dim * 2);
  std::vector<int32_t> physical(num_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::mt19937 rng(99);
  std::shuffle(physical.begin(), physical.end(), rng);
  cudaMemcpy(tables, physical.data(), physical.size() * 4, cudaMemcpyHostToDevice);
  const std::vector<int32_t> contexts(batch, context);
  cudaMemcpy(lens, contexts.data(), contexts.size() * 4, cudaMemcpyHostToDevice);

  const PagedDecodeArgs args{.q = q,
                             .q_stride = kQHeads * head_dim,
                             .out = out,
                             .out_stride = kQHeads * head_dim,
                             .kv_base = cache,
                             .kv_dtype = fp8 ? DecodeKvDtype::kFp8E4M3 : DecodeKvDtype::kBf16,
                             .block_stride_elems = fp8 ? block_bytes : 2 * half,
                             .value_offset_elems = half,
                             .scale_offset_elems = fp8 ? 2 * half : 0,
                             .block_size = kBlockSize,
                             .num_q_heads = kQHeads,
                             .num_kv_heads = kKvHeads,
                             .head_dim = head_dim,
                             .block_tables = tables,
                             .max_blocks_per_seq = blocks_per_seq,
                             .context_lens = lens,
                             .batch = batch,
                             .scale = 1.0f / std::sqrt(static_cast<float>(head_dim))};
  if (const absl::Status status =
          LaunchPagedDecodeAttention(args, plan, workspace, workspace_bytes, nullptr);
      !status.ok()) {
    state.SkipWithError(status.ToString().c_str());
    return;
  }
  // The ceiling: the read probe over the cache (the same K + V bytes), best
  // of 5 rounds after a warmup.
  TimeLaunches(3, [&] { (void)LaunchReadCeiling(cache, cache_bytes, sink, nullptr); });
  float ceiling_ms = 1e30f;
  for (int i = 0; i < 5; ++i) {
    ceiling_ms = std::min(ceiling_ms, TimeLaunches(kLaunchesPerIteration, [&] {
                            (void)LaunchReadCeiling(cache, cache_bytes, sink, nullptr);
                          }));
  }
  PagedDecodeArgs chained = args;
  chained.pdl = true;
  chained.stable_prefix = stable_prefix;
  testing::GraphTimer timer(kLaunchesPerIteration, [&](cudaStream_t stream) {
    (void)LaunchPagedDecodeAttention(chained, plan, workspace, workspace_bytes, stream);
  });
  if (!timer.ok()) {
    state.SkipWithError("capturing the launches into a CUDA graph failed");
    return;
  }
  timer.Time();  // Warmup.
  for (auto _ : state) state.SetIterationTime(timer.Time() / 1e3);
  if (cudaDeviceSynchronize() != cudaSuccess) state.SkipWithError("kernel failed");
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kv_bytes));
  const double ceiling_gbps = cache_bytes / (ceiling_ms * 1e-3) / 1e9;
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(kv_bytes) / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
  state.counters["ceiling_GB/s"] = ceiling_gbps;
  state.counters["splits"] = plan.num_splits;
  state.counters["variant"] = plan.variant;
  state.counters["ctas_per_sm"] = DecodeCtasPerSm(plan.variant, head_dim);
  state.counters["of_ceiling"] =
      benchmark::Counter(static_cast<double>(kv_bytes) / 1e9 / ceiling_gbps,
                         benchmark::Counter::kIsIterationInvariantRate);
  cudaFree(cache);
  cudaFree(q);
  cudaFree(out);
  cudaFree(workspace);
  cudaFree(tables);
  cudaFree(lens);
  cudaFree(sink);
}

void Shapes(benchmark::internal::Benchmark* b) {
  const int64_t shapes[][2] = {{1, 32768}, {16, 4096}, {16, 16384},
                               {64, 4096}, {64, 8192}, {128, 2048}};
  for (const auto& shape : shapes) {
    for (int64_t variant = -1; variant < kNumDecodeVariants; ++variant) {
      b->Args({shape[0], shape[1], variant, 128, 0, 0, 0});
    }
    // FP8: the default and the tensor-core variants (0 runs the default).
    for (int64_t variant = -1; variant < kNumDecodeVariants; ++variant) {
      if (variant != 0) b->Args({shape[0], shape[1], variant, 128, 1, 0, 0});
    }
  }
  // FP8 with few (sequence, KV head) items: the 4- and 8-warp CTAs at
  // forced split counts (the kernel converts every byte, so it wants more
  // warps an SM than the bf16 one at the same bytes).
  const int64_t few[][2] = {{1, 32768}, {1, 8192}, {16, 4096}};
  for (const auto& shape : few) {
    for (int64_t variant : {1, 2, 5}) {
      for (int64_t splits : {8, 16, 32, 64, 128}) {
        b->Args({shape[0], shape[1], variant, 128, 1, splits, 0});
      }
    }
  }
  // The other common head dims with the default variant: 80 and 96 on the
  // 128-wide kernels with the rest masked, 64 and 256 on their own.
  for (int64_t head_dim : {64, 80, 96, 256}) {
    b->Args({16, 16384, -1, head_dim, 0, 0, 0});
    b->Args({16, 16384, -1, head_dim, 1, 0, 0});
  }
  // A batch-1 step at a short context (a 512-token prompt): the planner's
  // count (0) against forced ones, for the 2-, 4- and 8-warp CTAs and
  // the 2-warp, 3-stage one.
  for (int64_t context : {576, 2048}) {
    for (int64_t variant : {4, 1, 5, 6}) {
      for (int64_t splits : {0, 1, 2, 4, 8, 16}) b->Args({1, context, variant, 128, 0, splits, 0});
    }
  }
  // Batch 1 and 2 at short and middle contexts: the default (w8_s2), the
  // cluster variants and the planner's pick, each with and without
  // stable_prefix (its first chunks copied before the wait on the launch
  // ahead).
  for (int64_t batch : {1, 2}) {
    for (int64_t context : {576, 2048, 4096, 8192}) {
      for (int64_t variant : {-1, 5, 10, 11}) {
        for (int64_t stable : {0, 1}) b->Args({batch, context, variant, 128, 0, 0, stable});
      }
    }
  }
  // A batch-64 step at the same context (the end-to-end table's): every
  // variant, at the planner's count and at 1 and 2 splits.
  for (int64_t variant = 0; variant < kNumDecodeVariants; ++variant) {
    for (int64_t splits : {0, 1, 2}) b->Args({64, 576, variant, 128, 0, splits, 0});
  }
  // Around it, for a planner that picks the variant by shape: the CTAs per
  // SM (1 for mma_w8_s2, 2-4 for the smaller ones) against the waves.
  const int64_t around[][2] = {{16, 576}, {128, 576}, {64, 1024}, {64, 2048}, {256, 576}};
  for (const auto& shape : around) {
    for (int64_t variant : {1, 2, 5, 6, 8}) b->Args({shape[0], shape[1], variant, 128, 0, 0, 0});
  }
}

// An iteration times kLaunchesPerIteration launches and reports one's time,
// so the default half second of reported time would be 20 x 0.5 s of wall
// time per row (10 s at 64 x 2048); 25 ms of reported time is still ~2000
// launches at the slowest rows, and the whole table runs in minutes.
BENCHMARK(BM_PagedDecodeAttention)
    ->UseManualTime()
    ->MinTime(0.025)
    ->ArgNames({"batch", "context", "variant", "head_dim", "fp8", "splits", "stable"})
    ->Apply(Shapes);

}  // namespace
}  // namespace trident::kernels::cuda
