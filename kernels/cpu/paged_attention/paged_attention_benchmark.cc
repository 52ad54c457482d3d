// Decode attention over a paged KV cache: batch 16, 4096-token contexts,
// 32 query heads over 8 KV heads, head_dim 128. Reports the KV bytes read per
// second next to a plain streaming read of the same bytes measured in the
// same run (the bandwidth ceiling).

#include <omp.h>

#include <numeric>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/paged_attention/paged_attention.h"

namespace trident::kernels::cpu {
namespace {

void BM_DecodeAttention(benchmark::State& state) {
  const numeric::DType dtype =
      state.range(0) == 0 ? numeric::DType::kF32 : numeric::DType::kBF16;
  const int32_t batch = 16, ctx = 4096, nq = 32, nkv = 8, d = 128, bs = 16;
  PagedKv kv;
  kv.dtype = dtype;
  kv.block_size = bs;
  kv.num_kv_heads = nkv;
  kv.head_dim = d;
  kv.value_offset_elems = static_cast<int64_t>(nkv) * bs * d;
  kv.block_stride_elems = 2 * kv.value_offset_elems;
  const int32_t blocks_per_seq = ctx / bs;
  const size_t elem = numeric::ElementSize(dtype);
  std::vector<char> storage(static_cast<size_t>(batch) * blocks_per_seq * kv.block_stride_elems *
                            elem);
  std::mt19937 rng(1);
  for (size_t i = 0; i < storage.size(); i += 2) storage[i] = static_cast<char>(rng() & 0x3f);
  kv.base = storage.data();
  std::vector<int32_t> table(static_cast<size_t>(batch) * blocks_per_seq);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<AttentionSequence> seqs;
  for (int32_t b = 0; b < batch; ++b) {
    seqs.push_back({table.data() + b * blocks_per_seq, ctx, 1, b});
  }
  std::vector<float> q(static_cast<size_t>(batch) * nq * d, 0.01f), out(q.size());
  for (auto _ : state) {
    PagedAttention(kv, q.data(), nq * d, nq, seqs, 0.088f, out.data(), nq * d);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(storage.size()));
  state.SetLabel(dtype == numeric::DType::kF32 ? "f32 KV" : "bf16 KV");
}
BENCHMARK(BM_DecodeAttention)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// The ceiling: summing the same number of bytes, streamed.
void BM_StreamRead(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(16) * 4096 * 2 * 8 * 128 * 4;
  std::vector<float> buf(bytes / sizeof(float), 1.0f);
  for (auto _ : state) {
    float total = 0;
#pragma omp parallel for reduction(+ : total)
    for (size_t i = 0; i < buf.size(); ++i) total += buf[i];
    benchmark::DoNotOptimize(total);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes));
}
BENCHMARK(BM_StreamRead)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace trident::kernels::cpu
