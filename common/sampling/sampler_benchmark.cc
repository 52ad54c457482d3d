// Cost of sampling one position over a Llama-3-sized vocabulary.

#include <cstdint>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/sampling/sampler.h"

namespace trident::sampling {
namespace {

constexpr int32_t kVocab = 128256;

std::vector<float> RandomLogits() {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(kVocab);
  for (float& x : logits) x = normal(rng);
  return logits;
}

void Run(benchmark::State& state, const SamplingParams& params) {
  const std::vector<float> logits = RandomLogits();
  Sampler sampler;
  PenaltyState penalties;
  int64_t position = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(sampler.Sample(logits, params, penalties, position++));
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Greedy(benchmark::State& state) {
  SamplingParams params;
  params.temperature = 0;
  Run(state, params);
}
BENCHMARK(BM_Greedy);

void BM_Plain(benchmark::State& state) { Run(state, SamplingParams()); }
BENCHMARK(BM_Plain);

void BM_TopK50(benchmark::State& state) {
  SamplingParams params;
  params.top_k = 50;
  Run(state, params);
}
BENCHMARK(BM_TopK50);

void BM_TopP09(benchmark::State& state) {
  SamplingParams params;
  params.top_p = 0.9f;
  Run(state, params);
}
BENCHMARK(BM_TopP09);

void BM_TopLogprobs20(benchmark::State& state) {
  SamplingParams params;
  params.top_logprobs = 20;
  params.logprobs = true;
  Run(state, params);
}
BENCHMARK(BM_TopLogprobs20);

}  // namespace
}  // namespace trident::sampling
