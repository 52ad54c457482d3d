// ApplyRope over a Llama-3-8B-shaped q/k (32 q heads, 8 kv heads, head_dim
// 128, llama3 scaling); bytes are the q and k values read and written.
//
//   bazel run --config=opt //kernels/cpu/rope:rope_benchmark

#include <cstdint>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/rope/rope.h"

namespace trident::kernels::cpu {
namespace {

void BM_ApplyRope(benchmark::State& state) {
  const int64_t num_tokens = state.range(0);
  const int32_t num_q_heads = 32;
  const int32_t num_kv_heads = 8;
  const RopeConfig config{.head_dim = 128, .theta = 500000.0, .llama3_scaling = true};
  const int32_t d = config.head_dim;
  const std::vector<float> inv_freq = RopeInvFreq(config);
  std::mt19937 rng(1);
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::vector<float> q(num_tokens * num_q_heads * d);
  std::vector<float> k(num_tokens * num_kv_heads * d);
  for (float& x : q) x = value(rng);
  for (float& x : k) x = value(rng);
  std::vector<int32_t> positions(num_tokens);
  for (int64_t t = 0; t < num_tokens; ++t) positions[t] = static_cast<int32_t>(1000 + t);
  for (auto _ : state) {
    ApplyRope(q.data(), num_q_heads * d, num_q_heads, k.data(), num_kv_heads * d, num_kv_heads, d,
              positions.data(), num_tokens, inv_freq.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * (q.size() + k.size()) * sizeof(float));
  state.SetItemsProcessed(state.iterations() * num_tokens);
}
BENCHMARK(BM_ApplyRope)->Arg(1)->Arg(16)->Arg(512)->Arg(4096);

}  // namespace
}  // namespace trident::kernels::cpu
