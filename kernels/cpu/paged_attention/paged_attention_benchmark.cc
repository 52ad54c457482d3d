// PagedAttention on Llama-3-8B attention shapes (32 q heads, 8 kv heads,
// head_dim 128, blocks of 16). Decode reports the GB/s of KV read (every
// cached K and V element of the batch, once); prefill reports GFLOP/s.
//
//   bazel run --config=opt //kernels/cpu/paged_attention:paged_attention_benchmark

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/numeric/dtype.h"
#include "kernels/cpu/paged_attention/paged_attention.h"

namespace trident::kernels::cpu {
namespace {

constexpr int32_t kQHeads = 32;
constexpr int32_t kKvHeads = 8;
constexpr int32_t kHeadDim = 128;
constexpr int32_t kBlockSize = 16;

struct Setup {
  PagedKv kv;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<std::vector<int32_t>> tables;
  std::vector<AttentionSequence> seqs;
  std::vector<float> q;
  std::vector<float> out;
};

// `batch` sequences of `context` tokens, each with `query_len` new tokens, on
// shuffled blocks filled with random values.
void Build(numeric::DType dtype, int32_t batch, int32_t context, int32_t query_len, Setup* s) {
  const int64_t half = static_cast<int64_t>(kKvHeads) * kBlockSize * kHeadDim;
  const int32_t blocks_per_seq = (context + kBlockSize - 1) / kBlockSize;
  const int64_t num_blocks = static_cast<int64_t>(batch) * blocks_per_seq;
  s->kv = PagedKv{nullptr, dtype, kBlockSize, kKvHeads, kHeadDim, 2 * half, half};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  const size_t elems = num_blocks * 2 * half;
  if (dtype == numeric::DType::kF32) {
    s->f32.resize(elems);
    for (float& x : s->f32) x = unit(rng);
    s->kv.base = s->f32.data();
  } else {
    s->bf16.resize(elems);
    for (uint16_t& x : s->bf16) x = numeric::FloatToBf16(unit(rng));
    s->kv.base = s->bf16.data();
  }
  std::vector<int32_t> physical(num_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  s->tables.resize(batch);
  for (int32_t b = 0; b < batch; ++b) {
    s->tables[b].assign(physical.begin() + b * blocks_per_seq,
                        physical.begin() + (b + 1) * blocks_per_seq);
    s->seqs.push_back(AttentionSequence{s->tables[b].data(), context, query_len,
                                        static_cast<int64_t>(b) * query_len});
  }
  s->q.resize(static_cast<size_t>(batch) * query_len * kQHeads * kHeadDim);
  for (float& x : s->q) x = unit(rng);
  s->out.resize(s->q.size());
}

void BM_Decode(benchmark::State& state) {
  const numeric::DType dtype = state.range(0) == 16 ? numeric::DType::kBF16 : numeric::DType::kF32;
  const int32_t batch = static_cast<int32_t>(state.range(1));
  const int32_t context = static_cast<int32_t>(state.range(2));
  Setup s;
  Build(dtype, batch, context, 1, &s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  for (auto _ : state) {
    PagedAttention(s.kv, s.q.data(), kQHeads * kHeadDim, kQHeads, s.seqs, scale, s.out.data(),
                   kQHeads * kHeadDim);
    benchmark::ClobberMemory();
  }
  const double kv_bytes = 2.0 * batch * context * kKvHeads * kHeadDim * numeric::ElementSize(dtype);
  state.counters["KV_GB/s"] =
      benchmark::Counter(kv_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Decode)
    ->ArgsProduct({{16, 32}, {16}, {4096}})
    ->Args({16, 1, 4096})
    ->Args({16, 1, 32768})
    ->UseRealTime();

void BM_Prefill(benchmark::State& state) {
  const int32_t tokens = static_cast<int32_t>(state.range(0));
  Setup s;
  Build(numeric::DType::kBF16, 1, tokens, tokens, &s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  for (auto _ : state) {
    PagedAttention(s.kv, s.q.data(), kQHeads * kHeadDim, kQHeads, s.seqs, scale, s.out.data(),
                   kQHeads * kHeadDim);
    benchmark::ClobberMemory();
  }
  // Causal: about tokens^2 / 2 scores per head, 2 flops each for QK and PV.
  const double flops = 4.0 * kQHeads * kHeadDim * tokens * (tokens + 1) / 2.0;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Prefill)->Arg(512)->Arg(2048)->UseRealTime();

}  // namespace
}  // namespace trident::kernels::cpu
