// Bandwidth of bf16 decode attention (32 q / 8 kv heads, head_dim 128) per
// ISA path and KV packing (rows: blocks of 16 tokens; pairs: the VNNI-pair
// packing the attention service stores, blocks of 32), against a plain
// streaming read measured in the same run with the same threads. Threads: one per physical core of
// the affinity mask (//common/cpu:threads GetCpuPlacement), pinned, spinning between phases as the
// service's pool does; each iteration is Plan, Run on every thread, Merge on every thread.
//
// Every sequence's KV is a separate contiguous run of blocks per layer, and
// iterations walk through enough layers that the working set is at least
// WorkingSetBytes() (4x the LLC), as decode steps walk the model's
// layers: the figures are DRAM bandwidth, not cache bandwidth.
//
// Counters per row: GB/s of K + V read (every cached element once; q, o and
// partials are < 1% of it), ceiling_GB/s (a plain streaming read of the
// row's own KV copies with the same threads, best of 3), of_ceiling their
// ratio, threads, layers (distinct KV copies cycled). Rows with hot:1 keep
// one 8 MiB layer, which stays in the LLC: they measure the kernel's compute
// speed against a DRAM read of WorkingSetBytes() (of_ceiling above 1 means
// faster than DRAM can feed it).
//
// BM_AppendDecodeKv: the append path's speed on one thread (see there).
//
//   bazel run --config=cpu -c opt //kernels/cpu/decode_attention:decode_attention_benchmark --
//     --benchmark_filter='isa:2/batch:8/.*pairs:1'

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "common/cpu/cpu_features.h"
#include "common/cpu/threads.h"
#include "kernels/cpu/decode_attention/decode_attention.h"

namespace trident::kernels::cpu {
namespace {

constexpr int32_t kQHeads = 32;
constexpr int32_t kKvHeads = 8;
constexpr int32_t kHeadDim = 128;
constexpr int64_t kTokenBytes = 2LL * kKvHeads * kHeadDim * 2;  // K + V, bf16.

// The benchmark's bf16 KV layout: blocks of `block_size` tokens, K then V.
DecodeKvLayout Bf16Layout(int32_t block_size, DecodeKvPacking packing) {
  const int64_t half = int64_t{kKvHeads} * block_size * kHeadDim;
  return DecodeKvLayout{.dtype = numeric::DType::kBF16,
                        .num_kv_heads = kKvHeads,
                        .head_dim = kHeadDim,
                        .block_size = block_size,
                        .block_stride_elems = 2 * half,
                        .value_offset_elems = half,
                        .packing = packing};
}

// Bytes the KV copies (and the ceiling's buffer) span: 4x the last-level
// cache, at least 512 MiB (the GPU host's LLC is 300 MiB).
int64_t WorkingSetBytes() {
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::max<int64_t>(512LL << 20, 4LL * std::max(llc, 0L)) / 4096 * 4096;
}

void Pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// A pool of pinned threads that spin between jobs; the caller is thread 0.
class SpinPool {
 public:
  explicit SpinPool(const std::vector<int>& cpus) : size_(static_cast<int>(cpus.size())) {
    Pin(cpus[0]);
    for (int i = 1; i < size_; ++i) {
      threads_.emplace_back([this, i, cpu = cpus[i]] {
        Pin(cpu);
        Work(i);
      });
    }
  }
  ~SpinPool() {
    stop_.store(true);
    for (std::thread& t : threads_) t.join();
  }

  int size() const { return size_; }

  // Runs job(i) on thread i for every i, returns when all are done.
  void Run(const std::function<void(int)>& job) {
    job_ = &job;
    pending_.store(size_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    job(0);
    while (pending_.load(std::memory_order_acquire) != 0) _mm_pause();
  }

 private:
  void Work(int i) {
    uint64_t seen = 0;
    while (true) {
      uint64_t now;
      while ((now = generation_.load(std::memory_order_acquire)) == seen) {
        if (stop_.load(std::memory_order_relaxed)) return;
        _mm_pause();
      }
      seen = now;
      (*job_)(i);
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  const int size_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

SpinPool& Pool() {
  static SpinPool* const pool = [] {
    absl::StatusOr<trident::cpu::CpuPlacement> placement = trident::cpu::GetCpuPlacement();
    std::vector<int> cpus = {0};
    if (placement.ok()) {
      cpus.assign(placement->cpus.begin(), placement->cpus.begin() + placement->num_physical_cores);
    }
    return new SpinPool(cpus);
  }();
  return *pool;
}

__attribute__((target("avx512f"))) uint64_t SumAvx512(const char* p, int64_t bytes) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  for (int64_t i = 0; i + 256 <= bytes; i += 256) {
    a = _mm512_add_epi64(a, _mm512_load_si512(p + i));
    b = _mm512_add_epi64(b, _mm512_load_si512(p + i + 64));
    c = _mm512_add_epi64(c, _mm512_load_si512(p + i + 128));
    d = _mm512_add_epi64(d, _mm512_load_si512(p + i + 192));
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

__attribute__((target("avx2"))) uint64_t SumAvx2(const char* p, int64_t bytes) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (int64_t i = 0; i + 128 <= bytes; i += 128) {
    a = _mm256_add_epi64(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi64(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    c = _mm256_add_epi64(c, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    d = _mm256_add_epi64(d, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

// GB/s of a plain streaming read of [buffer, buffer + bytes) split evenly
// over the pool, best of `passes` after a warm-up pass.
double StreamingReadGbps(SpinPool& pool, const char* buffer, int64_t bytes, int passes) {
  const int64_t slice = bytes / pool.size() / 256 * 256;
  const bool avx512 = trident::cpu::GetCpuFeatures().avx512f;
  std::vector<uint64_t> sinks(pool.size() * 8);
  double best = 0;
  for (int pass = 0; pass <= passes; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    pool.Run([&](int i) {
      sinks[i * 8] +=
          avx512 ? SumAvx512(buffer + i * slice, slice) : SumAvx2(buffer + i * slice, slice);
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (pass > 0) best = std::max(best, slice * pool.size() / seconds / 1e9);
  }
  benchmark::DoNotOptimize(sinks.data());
  return best;
}

// The DRAM ceiling for rows whose KV stays in the LLC: a streaming read of
// WorkingSetBytes() (each thread first-touches its own slice), measured once.
double DramCeilingGbps() {
  static const double gbps = [] {
    SpinPool& pool = Pool();
    const int64_t bytes = WorkingSetBytes();
    char* buffer = static_cast<char*>(std::aligned_alloc(4096, bytes));
    const int64_t slice = bytes / pool.size() / 256 * 256;
    pool.Run([&](int i) { std::memset(buffer + i * slice, 1, slice); });
    const double best = StreamingReadGbps(pool, buffer, bytes, 5);
    std::free(buffer);
    return best;
  }();
  return gbps;
}

void BM_DecodeAttention(benchmark::State& state) {
  const DecodeIsa isa = static_cast<DecodeIsa>(state.range(0));
  const int32_t batch = static_cast<int32_t>(state.range(1));
  const int32_t context = static_cast<int32_t>(state.range(2));
  const bool hot = state.range(3) != 0;
  const DecodeKvPacking packing =
      state.range(4) != 0 ? DecodeKvPacking::kPairs : DecodeKvPacking::kRows;
  const int32_t block_size = packing == DecodeKvPacking::kPairs ? 32 : 16;
  SpinPool& pool = Pool();
  absl::StatusOr<std::unique_ptr<DecodeAttention>> created =
      DecodeAttention::Create(DecodeAttentionOptions{.max_threads = pool.size(),
                                                     .max_sequences = batch,
                                                     .max_q_heads = kQHeads,
                                                     .max_head_dim = kHeadDim,
                                                     .isa = isa});
  if (!created.ok()) {
    state.SkipWithError(created.status().ToString().c_str());
    return;
  }
  DecodeAttention& kernel = **created;
  state.SetLabel(absl::StrCat(DecodeIsaName(kernel.isa()), " ", DecodeKvPackingName(packing)));

  const DecodeKvLayout layout = Bf16Layout(block_size, packing);
  const int64_t half = layout.value_offset_elems;
  const int64_t blocks = (context + block_size - 1) / block_size;
  const int64_t seq_bytes = blocks * 2 * half * 2;
  const int64_t layer_bytes = seq_bytes * batch;
  const int layers =
      hot ? 1 : static_cast<int>(std::max<int64_t>(1, WorkingSetBytes() / layer_bytes));
  std::unique_ptr<char, decltype(&std::free)> kv(
      static_cast<char*>(std::aligned_alloc(4096, layer_bytes * layers)), &std::free);
  // 0x3c3c is bf16 ~0.0115: finite scores everywhere.
  const int64_t slice = layer_bytes * layers / pool.size() / 4096 * 4096;
  pool.Run([&](int i) {
    const int64_t end = i + 1 == pool.size() ? layer_bytes * layers : (i + 1) * slice;
    std::memset(kv.get() + i * slice, 0x3c, end - i * slice);
  });
  // The ceiling of a cold row is a plain read of its own KV copies, just
  // filled: the same pages, so the ratio does not depend on where they
  // landed (on some hosts a read varies by 30% from one allocation to the
  // next).
  const double ceiling =
      hot ? DramCeilingGbps() : StreamingReadGbps(pool, kv.get(), layer_bytes * layers, 3);
  std::vector<float> q(static_cast<size_t>(batch) * kQHeads * kHeadDim, 0.01f);
  std::vector<float> o(q.size()), lse(static_cast<size_t>(batch) * kQHeads);
  std::vector<std::vector<DecodeSequence>> seqs(layers);
  for (int l = 0; l < layers; ++l) {
    for (int32_t s = 0; s < batch; ++s) {
      const int64_t rows = static_cast<int64_t>(s) * kQHeads;
      seqs[l].push_back(DecodeSequence{kv.get() + l * layer_bytes + s * seq_bytes, context,
                                       q.data() + rows * kHeadDim, o.data() + rows * kHeadDim,
                                       lse.data() + rows});
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  const std::function<void(int)> run = [&](int i) { kernel.Run(i); };
  const std::function<void(int)> merge = [&](int i) { kernel.Merge(i); };
  int layer = 0;
  for (auto _ : state) {
    if (!kernel.Plan(layout, kQHeads, scale, seqs[layer], pool.size()).ok()) {
      state.SkipWithError("Plan failed");
      return;
    }
    pool.Run(run);
    pool.Run(merge);
    layer = (layer + 1) % layers;
  }
  benchmark::DoNotOptimize(o.data());
  const double kv_gb = static_cast<double>(batch) * context * kTokenBytes / 1e9;
  state.counters["GB/s"] = benchmark::Counter(kv_gb, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["ceiling_GB/s"] = ceiling;
  state.counters["of_ceiling"] =
      benchmark::Counter(kv_gb / ceiling, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = pool.size();
  state.counters["layers"] = layers;
}

// Batch 1-32 x context 320 (short sequences, many per call) and 2k-32k
// where one layer's KV stays <= 1 GiB, for every ISA path this CPU has and
// both packings.
void Shapes(benchmark::internal::Benchmark* b) {
  for (int64_t pairs : {0, 1}) {
    for (DecodeIsa isa : {DecodeIsa::kAvx2, DecodeIsa::kAvx512Bf16, DecodeIsa::kAmx}) {
      if (!DecodeIsaAvailable(isa)) continue;
      for (int64_t batch : {1, 4, 8, 32}) {
        for (int64_t context : {320, 2048, 8192, 32768}) {
          if (batch * context * kTokenBytes > (1LL << 30)) continue;
          b->Args({static_cast<int64_t>(isa), batch, context, 0, pairs});
        }
      }
      b->Args({static_cast<int64_t>(isa), 1, 2048, 1, pairs});
    }
  }
}

BENCHMARK(BM_DecodeAttention)
    ->ArgNames({"isa", "batch", "context", "hot", "pairs"})
    ->Apply(Shapes)
    ->UseRealTime();

// AppendDecodeKv on one thread: a migration's 512-token append of one
// layer (32 blocks of 16 tokens or 16 of 32) into a bf16 store, from f32 or
// bf16 rows. Counter: GB/s of K + V written (bf16).
void BM_AppendDecodeKv(benchmark::State& state) {
  const bool pairs = state.range(0) != 0;
  const bool bf16_rows = state.range(1) != 0;
  constexpr int32_t kTokens = 512;
  const int32_t block_size = pairs ? 32 : 16;
  const DecodeKvLayout layout =
      Bf16Layout(block_size, pairs ? DecodeKvPacking::kPairs : DecodeKvPacking::kRows);
  const int64_t half = layout.value_offset_elems;
  std::vector<uint16_t> cache(static_cast<size_t>(kTokens / block_size) * 2 * half);
  const size_t row = static_cast<size_t>(kKvHeads) * kHeadDim;
  std::vector<float> k(kTokens * row, 0.5f), v(k.size(), -0.25f);
  std::vector<uint16_t> k_bits(k.size(), 0x3f00), v_bits(k.size(), 0xbe80);
  std::vector<DecodeKvAppend> tokens(kTokens);
  for (int32_t t = 0; t < kTokens; ++t) {
    tokens[t] = DecodeKvAppend{.kv = cache.data(), .position = t};
    if (bf16_rows) {
      tokens[t].k_bf16 = &k_bits[t * row];
      tokens[t].v_bf16 = &v_bits[t * row];
    } else {
      tokens[t].k = &k[t * row];
      tokens[t].v = &v[t * row];
    }
  }
  for (auto _ : state) {
    if (absl::Status s = AppendDecodeKv(layout, tokens); !s.ok()) {
      state.SkipWithError(std::string(s.message()).c_str());
      return;
    }
    benchmark::DoNotOptimize(cache.data());
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(kTokens) * kTokenBytes,
                                              benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}

BENCHMARK(BM_AppendDecodeKv)
    ->ArgNames({"pairs", "bf16_rows"})
    ->Args({0, 0})
    ->Args({0, 1})
    ->Args({1, 0})
    ->Args({1, 1});

}  // namespace
}  // namespace trident::kernels::cpu
