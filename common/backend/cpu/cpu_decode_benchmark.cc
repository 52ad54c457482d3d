// CPU decode speed of the ~100M-parameter llama-100m model (generated on
// first run into $TRIDENT_BENCH_DIR or /tmp), against the machine's memory
// read bandwidth measured in the same run:
//
//   bazel run -c opt --config=opt //common/backend/cpu:cpu_decode_benchmark
//
// Reported per benchmark: tokens/s, and weight_bw_fraction = (weight bytes
// read per decode step / step time) / bw_GBps, the read bandwidth measured in
// the same run over a buffer as large as the weights: the share of the
// bandwidth roofline that decode achieves. dram_GBps (a 1 GiB stream) is
// printed beside it; on CPUs whose last-level cache holds much of the
// weights, the weights stream faster than DRAM.

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/cpu/threads.h"
#include "common/logging/log.h"
#include "common/model/generate/model_gen.h"

namespace trident::backend {
namespace {

std::string ModelDir() {
  const char* dir = std::getenv("TRIDENT_BENCH_DIR");
  const std::string base = dir != nullptr ? dir : "/tmp";
  const std::string model_dir = base + "/trident-llama-100m";
  if (access((model_dir + "/config.json").c_str(), F_OK) != 0) {
    auto spec = model::generate::PresetSpec("llama-100m");
    TRIDENT_CHECK_OK(spec.status());
    TRIDENT_CHECK_OK(model::generate::WriteModel(*spec, model_dir));
  }
  return model_dir;
}

// Read bandwidth of this machine with every thread streaming its part of a
// buffer of `bytes` (best of 5 passes), in bytes/s. With the size of the
// weights, this is the ceiling for reading them once a step, from whatever
// level of the memory hierarchy holds a working set that large.
double MeasureReadBandwidth(size_t bytes) {
  static std::map<size_t, double> cache;
  if (auto it = cache.find(bytes); it != cache.end()) return it->second;
  const double bandwidth = [bytes] {
    const size_t n = bytes / sizeof(uint64_t);
    std::vector<uint64_t> buffer(n);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) buffer[i] = i * 0x9e3779b97f4a7c15ull;
    double best = 0;
    for (int pass = 0; pass < 5; ++pass) {
      const auto start = std::chrono::steady_clock::now();
      // XOR has a one-cycle latency and vectorizes, so the loop is bound by
      // memory, not by the arithmetic.
      uint64_t folded = 0;
#pragma omp parallel for simd schedule(static) reduction(^ : folded)
      for (size_t i = 0; i < n; ++i) folded ^= buffer[i];
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      benchmark::DoNotOptimize(folded);
      best = std::max(best, n * sizeof(uint64_t) / s);
    }
    std::printf("measured read bandwidth over %.0f MB: %.2f GB/s (%d threads)\n", bytes / 1e6,
                best / 1e9, omp_get_max_threads());
    return best;
  }();
  cache[bytes] = bandwidth;
  return bandwidth;
}

CpuBackend& Backend(numeric::DType dtype) {
  static std::unique_ptr<CpuBackend> backends[2];
  auto& slot = backends[dtype == numeric::DType::kF32 ? 0 : 1];
  if (slot == nullptr) {
    CpuBackendOptions options;
    options.compute_dtype = dtype;
    options.kv_dtype = dtype;
    options.kv_cache_bytes = int64_t{1} << 30;
    auto created = CpuBackend::Create(ModelDir(), options);
    TRIDENT_CHECK_OK(created.status());
    slot = std::move(*created);
  }
  return *slot;
}

// Decode steps for `batch` sequences with a 256-token context each.
void BM_Decode(benchmark::State& state, numeric::DType dtype) {
  CpuBackend& backend = Backend(dtype);
  // DRAM (a 1 GiB stream) for reference, and the ceiling for the weights'
  // own working set, which large last-level caches may partly hold.
  const double dram = MeasureReadBandwidth(size_t{1} << 30);
  const double bandwidth =
      MeasureReadBandwidth(static_cast<size_t>(backend.weight_bytes_per_step()));
  const int32_t batch = static_cast<int32_t>(state.range(0));
  const int32_t context = 256;
  const int32_t bs = backend.kv_capacity().block_size;
  const int32_t blocks_per_seq = (context + 64 + bs - 1) / bs;
  std::vector<std::vector<int32_t>> tables(batch);
  std::vector<std::vector<int32_t>> prompts(batch);
  for (int32_t b = 0; b < batch; ++b) {
    for (int32_t i = 0; i < blocks_per_seq; ++i) tables[b].push_back(b * blocks_per_seq + i);
    for (int32_t i = 0; i < context; ++i) prompts[b].push_back((i * 31 + b * 7) % 1000);
  }
  std::vector<float> logits(static_cast<size_t>(batch) * backend.vocab_size());
  // Prefill every sequence once.
  for (int32_t b = 0; b < batch; ++b) {
    StepSequence s{prompts[b], 0, tables[b], true};
    TRIDENT_CHECK_OK(backend.Forward({s}, logits.data()));
  }
  std::vector<int32_t> next(batch, 1);
  int32_t pos = context;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    std::vector<StepSequence> step;
    for (int32_t b = 0; b < batch; ++b) {
      step.push_back({absl::MakeConstSpan(&next[b], 1), pos, tables[b], true});
    }
    TRIDENT_CHECK_OK(backend.Forward(step, logits.data()));
    // Stay within the reserved blocks: cycle the last 64 positions.
    pos = pos + 1 < context + 64 ? pos + 1 : context;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double steps = static_cast<double>(state.iterations());
  const double weight_bps = steps * backend.weight_bytes_per_step() / seconds;
  state.counters["tokens_per_s"] = steps * batch / seconds;
  state.counters["weight_GBps"] = weight_bps / 1e9;
  state.counters["bw_GBps"] = bandwidth / 1e9;
  state.counters["dram_GBps"] = dram / 1e9;
  state.counters["weight_bw_fraction"] = weight_bps / bandwidth;
  state.SetLabel(backend.Describe());
}

BENCHMARK_CAPTURE(BM_Decode, f32, numeric::DType::kF32)
    ->Arg(1)
    ->Arg(8)
    ->Arg(32)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Decode, bf16, numeric::DType::kBF16)
    ->Arg(1)
    ->Arg(8)
    ->Arg(32)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace trident::backend
