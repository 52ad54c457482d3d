// GPU prefill attention over the FP8 E4M3 cache against the CPU reference
// (PagedAttentionReference) over the same stored values: the cache is
// written by cpu::AppendKvFp8 and the reference reads its dequantized K and
// V (cpu::ReadKvFp8). Both kernels round each dequantized value to bf16 as
// they load it (2^-9 relative) and P to bf16, so the bf16 test's tolerance
// holds. At head_dim 128 on an sm_90 device the test runs Hopper's kernel as
// well as the mma.sync one.
// Bytes the cache does not hold are 0x7f (E4M3 NaN): a read past a context
// that is not masked poisons the output.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/paged_attention/paged_attention.h"
#include "kernels/cpu/paged_attention/paged_attention_reference.h"
#include "kernels/cpu/paged_kv_fp8/paged_kv_fp8.h"
#include "kernels/cuda/arch/arch.h"
#include "kernels/cuda/paged_prefill_attention/paged_prefill_attention.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::testing::IsOk;

constexpr uint32_t kSeed = 9090;
constexpr float kAbsTolerance = 2e-2f;
constexpr float kRelTolerance = 1e-2f;
constexpr uint16_t kBf16Sentinel = 0x7fc1;

struct Case {
  std::string name;
  int32_t head_dim;
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t block_size;
  std::vector<std::pair<int32_t, int32_t>> seqs;  // (context_len, query_len).
};

template <typename T>
void* DeviceCopy(const std::vector<T>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(host.size() * sizeof(T), 16)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return p;
}

class PagedPrefillFp8Test : public ::testing::TestWithParam<Case> {};

TEST_P(PagedPrefillFp8Test, MatchesCpuReferenceOverTheStoredValues) {
  const Case& c = GetParam();
  std::printf("seed %u case %s\n", kSeed, c.name.c_str());
  std::mt19937 rng(kSeed);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  const int32_t batch = static_cast<int32_t>(c.seqs.size());
  const int32_t d = c.head_dim;
  int32_t num_blocks = 2;
  int32_t max_blocks = 1;
  for (const auto& [ctx, query] : c.seqs) {
    num_blocks += (ctx + c.block_size - 1) / c.block_size;
    max_blocks = std::max(max_blocks, (ctx + c.block_size - 1) / c.block_size + 1);
  }
  std::vector<unsigned char> fp8(
      static_cast<size_t>(num_blocks * cpu::Fp8BlockBytes(c.block_size, c.num_kv_heads, d)), 0x7f);
  const cpu::PagedKvFp8 fp8_kv = cpu::DensePagedKvFp8(fp8.data(), c.block_size, c.num_kv_heads, d);
  const int64_t half = static_cast<int64_t>(c.num_kv_heads) * c.block_size * d;
  cpu::PagedKv f32_kv;
  f32_kv.dtype = numeric::DType::kF32;
  f32_kv.block_size = c.block_size;
  f32_kv.num_kv_heads = c.num_kv_heads;
  f32_kv.head_dim = d;
  f32_kv.value_offset_elems = half;
  f32_kv.block_stride_elems = 2 * half;
  std::vector<float> stored(static_cast<size_t>(num_blocks * 2 * half), 0.0f);
  f32_kv.base = stored.data();
  std::vector<int32_t> physical(num_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  std::vector<int32_t> tables(static_cast<size_t>(batch) * max_blocks, -1);
  std::vector<int32_t> context_lens, query_lens, query_starts;
  std::vector<cpu::AttentionSequence> seqs;
  const int32_t kv_row = c.num_kv_heads * d;
  int32_t next_block = 0;
  int32_t rows = 0;
  int32_t max_query = 0;
  for (int32_t s = 0; s < batch; ++s) {
    const auto [ctx, query] = c.seqs[s];
    int32_t* table = tables.data() + static_cast<size_t>(s) * max_blocks;
    for (int32_t b = 0; b < (ctx + c.block_size - 1) / c.block_size; ++b) {
      table[b] = physical[next_block++];
    }
    std::vector<float> k(static_cast<size_t>(ctx) * kv_row), v(k.size());
    for (float& x : k) x = numeric::Bf16ToFloat(numeric::FloatToBf16(unit(rng)));
    for (float& x : v) x = numeric::Bf16ToFloat(numeric::FloatToBf16(unit(rng)));
    std::vector<int64_t> slots(ctx);
    for (int32_t p = 0; p < ctx; ++p) {
      slots[p] = static_cast<int64_t>(table[p / c.block_size]) * c.block_size + p % c.block_size;
    }
    cpu::AppendKvFp8(fp8_kv, k.data(), kv_row, v.data(), kv_row, slots.data(), ctx);
    std::vector<float> kd(d), vd(d);
    for (int32_t p = 0; p < ctx; ++p) {
      const int64_t block = slots[p] / c.block_size;
      const int32_t slot = static_cast<int32_t>(slots[p] % c.block_size);
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        cpu::ReadKvFp8(fp8_kv, block, slot, h, kd.data(), vd.data());
        const int64_t at = block * 2 * half + (static_cast<int64_t>(h) * c.block_size + slot) * d;
        std::copy(kd.begin(), kd.end(), stored.begin() + at);
        std::copy(vd.begin(), vd.end(), stored.begin() + at + half);
      }
    }
    seqs.push_back(cpu::AttentionSequence{table, ctx, query, rows});
    context_lens.push_back(ctx);
    query_lens.push_back(query);
    query_starts.push_back(rows);
    rows += query;
    max_query = std::max(max_query, query);
  }
  const int64_t width = static_cast<int64_t>(c.num_q_heads) * d;
  const int64_t q_stride = width + 2 * kv_row;
  const int64_t out_stride = width + 8;
  std::vector<uint16_t> q(static_cast<size_t>(rows) * q_stride);
  std::vector<float> q_float(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = numeric::FloatToBf16(unit(rng));
    q_float[i] = numeric::Bf16ToFloat(q[i]);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> want(static_cast<size_t>(rows) * out_stride, 0.0f);
  cpu::PagedAttentionReference(f32_kv, q_float.data(), q_stride, c.num_q_heads, seqs, scale,
                               want.data(), out_stride);

  void* d_cache = DeviceCopy(fp8);
  void* d_q = DeviceCopy(q);
  void* d_tables = DeviceCopy(tables);
  void* d_ctx = DeviceCopy(context_lens);
  void* d_query = DeviceCopy(query_lens);
  void* d_starts = DeviceCopy(query_starts);
  const std::vector<uint16_t> sentinel(static_cast<size_t>(rows) * out_stride, kBf16Sentinel);
  void* d_out = DeviceCopy(sentinel);
  PagedPrefillArgs args;
  args.q = d_q;
  args.q_stride = q_stride;
  args.out = d_out;
  args.out_stride = out_stride;
  args.kv_base = d_cache;
  args.kv_fp8 = true;
  args.block_stride_elems = fp8_kv.block_stride_bytes;
  args.value_offset_elems = fp8_kv.value_offset_bytes;
  args.scale_offset_elems = fp8_kv.scale_offset_bytes;
  args.block_size = c.block_size;
  args.num_q_heads = c.num_q_heads;
  args.num_kv_heads = c.num_kv_heads;
  args.head_dim = d;
  args.block_tables = static_cast<const int32_t*>(d_tables);
  args.max_blocks_per_seq = max_blocks;
  args.context_lens = static_cast<const int32_t*>(d_ctx);
  args.query_lens = static_cast<const int32_t*>(d_query);
  args.query_starts = static_cast<const int32_t*>(d_starts);
  args.batch = batch;
  args.max_query_len = max_query;
  args.scale = scale;
  // Both kernels where Hopper's applies: head_dim 128 in blocks that divide
  // its 128-key tiles, on an sm_90 device.
  std::vector<PrefillKernel> kernels = {PrefillKernel::kMmaSync};
  if (d == 128 && 128 % c.block_size == 0 && CurrentDeviceIsSm90())
    kernels.push_back(PrefillKernel::kWgmma);
  for (const PrefillKernel kernel : kernels) {
    const char* name = kernel == PrefillKernel::kWgmma ? "wgmma" : "mma.sync";
    args.kernel = kernel;
    std::vector<uint16_t> out = sentinel;
    ASSERT_EQ(cudaMemcpy(d_out, out.data(), out.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_THAT(LaunchPagedPrefillAttention(args, nullptr), IsOk()) << name;
    ASSERT_EQ(cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    int64_t failures = 0;
    float max_error = 0.0f;
    for (int32_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < out_stride; ++i) {
        const size_t at = static_cast<size_t>(r) * out_stride + i;
        if (i >= width) {
          if (out[at] != kBf16Sentinel && ++failures <= 5) {
            ADD_FAILURE() << name << ": row " << r << " column " << i << " past the heads written";
          }
          continue;
        }
        const float error = std::abs(numeric::Bf16ToFloat(out[at]) - want[at]);
        if (!(error <= kAbsTolerance + kRelTolerance * std::abs(want[at]))) {
          if (++failures <= 5) {
            ADD_FAILURE() << name << ": row " << r << " head " << i / d << " dim " << i % d
                          << ": got " << numeric::Bf16ToFloat(out[at]) << ", want " << want[at];
          }
          continue;
        }
        max_error = std::max(max_error, error);
      }
    }
    EXPECT_EQ(failures, 0) << name;
    std::printf("%s: max abs error %g\n", name, max_error);
  }
  for (void* p : {d_cache, d_q, d_tables, d_ctx, d_query, d_starts, d_out}) cudaFree(p);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PagedPrefillFp8Test,
    ::testing::Values(
        // Whole prompts, chunks after a cached prefix, a decode-like row.
        Case{"Dim128Gqa4", 128, 8, 2, 16, {{100, 100}, {300, 37}, {64, 1}, {1, 1}}},
        Case{"Dim128Gqa4Long", 128, 32, 8, 16, {{1500, 700}, {2048, 2048}}},
        // Hopper's kernel: blocks of 32 and 128 keys, GQA 8, a context
        // ending mid-group, one row past several tiles.
        Case{"Dim128Gqa8Block32", 128, 16, 2, 32, {{777, 777}, {1000, 129}, {530, 1}}},
        Case{"Dim128Block128", 128, 4, 2, 128, {{300, 300}, {129, 2}}},
        Case{"Dim64Block32", 64, 8, 8, 32, {{257, 257}, {500, 100}}},
        Case{"Dim256Gqa2", 256, 4, 2, 16, {{200, 200}, {129, 64}}},
        Case{"Dim80Gqa4Block48", 80, 8, 2, 48, {{300, 150}, {47, 47}}},
        Case{"Dim16Gqa1", 16, 2, 2, 16, {{90, 90}, {33, 5}}}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace trident::kernels::cuda
