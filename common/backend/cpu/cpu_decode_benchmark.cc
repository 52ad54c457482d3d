// CPU decode speed of the ~100M-parameter llama-100m model (generated on
// first run into $TRIDENT_BENCH_DIR or /tmp), against the machine's memory
// read bandwidth measured in the same run:
//
//   bazel run -c opt --config=opt //common/backend/cpu:cpu_decode_benchmark
//
// Reported per benchmark: tokens/s, and weight_bw_fraction = (weight bytes
// read per decode step / step time) / measured read bandwidth, the share of
// the bandwidth roofline that batch-1 decode achieves.

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/cpu/threads.h"
#include "common/logging/log.h"
#include "tools/make_model/model_gen.h"

namespace trident::backend {
namespace {

std::string ModelDir() {
  const char* dir = std::getenv("TRIDENT_BENCH_DIR");
  const std::string base = dir != nullptr ? dir : "/tmp";
  const std::string model = base + "/trident-llama-100m";
  if (access((model + "/config.json").c_str(), F_OK) != 0) {
    auto spec = make_model::PresetSpec("llama-100m");
    TRIDENT_CHECK_OK(spec.status());
    TRIDENT_CHECK_OK(make_model::WriteModel(*spec, model));
  }
  return model;
}

// Read bandwidth of this machine with every benchmark thread streaming its
// part of a 1 GiB buffer (best of 5 passes), in bytes/s.
double MeasureReadBandwidth() {
  static const double bandwidth = [] {
    const size_t n = (size_t{1} << 30) / sizeof(float);
    std::vector<float> buffer(n);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) buffer[i] = static_cast<float>(i & 1023);
    double best = 0;
    for (int pass = 0; pass < 5; ++pass) {
      const auto start = std::chrono::steady_clock::now();
      float total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
      for (size_t i = 0; i < n; ++i) total += buffer[i];
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      benchmark::DoNotOptimize(total);
      best = std::max(best, n * sizeof(float) / s);
    }
    std::printf("measured read bandwidth: %.2f GB/s (%d threads)\n", best / 1e9,
                omp_get_max_threads());
    return best;
  }();
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
  const double bandwidth = MeasureReadBandwidth();
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
  state.counters["weight_bw_fraction"] = weight_bps / bandwidth;
  state.SetLabel(backend.Describe());
}

BENCHMARK_CAPTURE(BM_Decode, f32, numeric::DType::kF32)
    ->Arg(1)->Arg(8)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Decode, bf16, numeric::DType::kBF16)
    ->Arg(1)->Arg(8)->Arg(32)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace trident::backend
