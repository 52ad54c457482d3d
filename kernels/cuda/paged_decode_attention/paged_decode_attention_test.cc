// GPU decode attention against the CPU reference (PagedAttentionReference,
// textbook softmax in double) on the same bf16 cache and bf16-rounded q, for
// every kernel variant (kNumDecodeVariants) on every case and split mode.
//
// Tolerance: |got - want| <= 1e-2 + 2^-8 * |want|. Outputs are convex
// combinations of N(0, 1) values, so they are unit-scale; the kernels' fp32
// accumulation and exp2 are ~1e-6 relative, the tensor-core variants round
// the probabilities to bf16 before the PV product (2^-9 relative each, at
// most ~2^-9 * mean |v| ~ 2e-3 absolute and far less on average), and the
// bf16 output rounding is at most 2^-9 relative (half an ulp), so a
// mis-indexed head, token, split or softmax shows up as errors far above
// this.

#include "kernels/cuda/paged_decode_attention/paged_decode_attention.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/paged_attention/paged_attention.h"
#include "kernels/cpu/paged_attention/paged_attention_reference.h"
#include "kernels/cuda/testing/pdl_late_copy.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::testing::IsOk;

constexpr uint32_t kSeed = 4242;
constexpr uint16_t kBf16Nan = 0x7fc0;

struct Case {
  std::string name;
  int32_t head_dim;
  int32_t num_q_heads;
  int32_t num_kv_heads;
  std::vector<int32_t> contexts;  // One per sequence; the batch size.
  float q_scale = 1.0f;           // 8: peaked softmax, the running max matters.
  int32_t block_size = 16;
};

// How the test picks the plan: PlanDecode for the device, or a fixed count.
// kStablePrefix: the planner's, launched with pdl and stable_prefix behind a
// chain of late copies (kernels/cuda/testing:pdl_late_copy) that write the
// block of each sequence's last position, which the cache held stale until
// then: a kernel that read that position before its wait would be wrong.
enum class SplitMode { kPlanner, kOne, kSeven, kMax, kStablePrefix };

// How long the first late copy waits before it writes.
constexpr int64_t kLateCopyDelayNs = 200000;

int32_t NumSms() {
  int device = 0;
  int sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 0;
  }
  return sms;
}

// Device memory freed on destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    if (bytes > 0) status_ = cudaMalloc(&ptr_, bytes);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  cudaError_t status() const { return status_; }

 private:
  void* ptr_ = nullptr;
  cudaError_t status_ = cudaSuccess;
};

class PagedDecodeAttentionTest : public ::testing::TestWithParam<std::tuple<Case, SplitMode>> {};

TEST_P(PagedDecodeAttentionTest, MatchesCpuReference) {
  const Case& c = std::get<0>(GetParam());
  const SplitMode mode = std::get<1>(GetParam());
  std::printf("seed %u case %s\n", kSeed, c.name.c_str());
  std::mt19937 rng(kSeed);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  const int32_t batch = static_cast<int32_t>(c.contexts.size());
  const int32_t d = c.head_dim;

  // Cache with padding after K, V and each block (multiples of 8 elements, as
  // the kernel's 16-byte loads need); every slot not written holds NaN, so a
  // read past a context poisons the output.
  cpu::PagedKv kv;
  kv.dtype = numeric::DType::kBF16;
  kv.block_size = c.block_size;
  kv.num_kv_heads = c.num_kv_heads;
  kv.head_dim = d;
  const int64_t half = static_cast<int64_t>(c.num_kv_heads) * c.block_size * d;
  kv.value_offset_elems = half + 8;
  kv.block_stride_elems = 2 * half + 24;
  int32_t max_blocks = 1;
  int32_t num_blocks = 3;  // Spare blocks no sequence uses.
  for (int32_t ctx : c.contexts) {
    const int32_t blocks = (ctx + c.block_size - 1) / c.block_size;
    max_blocks = std::max(max_blocks, blocks + 1);  // One unused entry per row.
    num_blocks += blocks;
  }
  std::vector<uint16_t> cache(static_cast<size_t>(num_blocks) * kv.block_stride_elems, kBf16Nan);
  kv.base = cache.data();
  std::vector<int32_t> physical(num_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);

  // Block tables, -1 where a sequence has no block (never read).
  std::vector<int32_t> tables(static_cast<size_t>(batch) * max_blocks, -1);
  std::vector<cpu::AttentionSequence> seqs;
  const int32_t kv_row = c.num_kv_heads * d;
  int32_t next_block = 0;
  for (int32_t s = 0; s < batch; ++s) {
    const int32_t ctx = c.contexts[s];
    int32_t* table = tables.data() + static_cast<size_t>(s) * max_blocks;
    for (int32_t b = 0; b < (ctx + c.block_size - 1) / c.block_size; ++b) {
      table[b] = physical[next_block++];
    }
    std::vector<float> k(static_cast<size_t>(ctx) * kv_row);
    std::vector<float> v(k.size());
    for (float& x : k) x = unit(rng);
    for (float& x : v) x = unit(rng);
    std::vector<int64_t> slots(ctx);
    for (int32_t p = 0; p < ctx; ++p) {
      slots[p] = static_cast<int64_t>(table[p / c.block_size]) * c.block_size + p % c.block_size;
    }
    cpu::AppendKv(kv, k.data(), kv_row, v.data(), kv_row, slots.data(), ctx);
    seqs.push_back(cpu::AttentionSequence{table, ctx, 1, s});
  }

  // q rows inside fused qkv rows; out rows wider than the heads.
  const int64_t width = static_cast<int64_t>(c.num_q_heads) * d;
  const int64_t q_stride = width + 2 * kv_row;
  const int64_t out_stride = width + 8;
  std::vector<uint16_t> q_bf16(static_cast<size_t>(batch) * q_stride);
  std::vector<float> q_float(q_bf16.size());
  for (size_t i = 0; i < q_bf16.size(); ++i) {
    q_bf16[i] = numeric::FloatToBf16(unit(rng) * c.q_scale);
    q_float[i] = numeric::Bf16ToFloat(q_bf16[i]);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));

  // The reference skips padding slots (context 0): they must come out zero.
  std::vector<float> want(static_cast<size_t>(batch) * out_stride, 0.0f);
  std::vector<cpu::AttentionSequence> live;
  for (const cpu::AttentionSequence& s : seqs) {
    if (s.context_len > 0) live.push_back(s);
  }
  cpu::PagedAttentionReference(kv, q_float.data(), q_stride, c.num_q_heads, live, scale,
                               want.data(), out_stride);

  int32_t max_context = 0;
  for (int32_t ctx : c.contexts) max_context = std::max(max_context, ctx);

  DeviceBuffer d_cache(cache.size() * 2);
  DeviceBuffer d_q(q_bf16.size() * 2);
  DeviceBuffer d_out(static_cast<size_t>(batch) * out_stride * 2);
  DeviceBuffer d_tables(tables.size() * 4);
  DeviceBuffer d_lens(c.contexts.size() * 4);
  for (const DeviceBuffer* b : {&d_cache, &d_q, &d_out, &d_tables, &d_lens}) {
    ASSERT_EQ(b->status(), cudaSuccess);
  }
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d_cache.get(), cache.data(), cache.size() * 2, cudaMemcpyHostToDevice,
                            stream),
            cudaSuccess);
  // kStablePrefix: the good cache aside, and the cache with each sequence's
  // last position (K and V of every kv head) changed.
  const bool stable = mode == SplitMode::kStablePrefix;
  DeviceBuffer d_good(stable ? cache.size() * 2 : 0);
  std::vector<uint16_t> stale;
  if (stable) {
    ASSERT_EQ(d_good.status(), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(d_good.get(), cache.data(), cache.size() * 2, cudaMemcpyHostToDevice,
                              stream),
              cudaSuccess);
    stale = cache;
    for (const cpu::AttentionSequence& q : live) {
      const int32_t t = q.context_len - 1;
      const int64_t block = q.block_table[t / c.block_size];
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        const int64_t at = block * kv.block_stride_elems +
                           (static_cast<int64_t>(h) * c.block_size + t % c.block_size) * d;
        for (int32_t e = 0; e < d; ++e) {
          for (int64_t offset : {int64_t{0}, kv.value_offset_elems}) {
            uint16_t& x = stale[at + offset + e];
            x = numeric::FloatToBf16(numeric::Bf16ToFloat(x) * -3.0f + 2.0f);
          }
        }
      }
    }
  }
  ASSERT_EQ(
      cudaMemcpyAsync(d_q.get(), q_bf16.data(), q_bf16.size() * 2, cudaMemcpyHostToDevice, stream),
      cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d_tables.get(), tables.data(), tables.size() * 4,
                            cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d_lens.get(), c.contexts.data(), c.contexts.size() * 4,
                            cudaMemcpyHostToDevice, stream),
            cudaSuccess);
  const PagedDecodeArgs args{.q = d_q.get(),
                             .q_stride = q_stride,
                             .out = d_out.get(),
                             .out_stride = out_stride,
                             .kv_base = d_cache.get(),
                             .block_stride_elems = kv.block_stride_elems,
                             .value_offset_elems = kv.value_offset_elems,
                             .block_size = c.block_size,
                             .num_q_heads = c.num_q_heads,
                             .num_kv_heads = c.num_kv_heads,
                             .head_dim = d,
                             .block_tables = static_cast<const int32_t*>(d_tables.get()),
                             .max_blocks_per_seq = max_blocks,
                             .context_lens = static_cast<const int32_t*>(d_lens.get()),
                             .batch = batch,
                             .scale = scale,
                             .pdl = stable,
                             .stable_prefix = stable};

  // Every variant on the same inputs; a failing variant is reported with its
  // first mismatch and its count of mismatches, and the others still run.
  for (int32_t variant = 0; variant < kNumDecodeVariants; ++variant) {
    SCOPED_TRACE(::testing::Message()
                 << "variant " << variant << " (" << DecodeVariantName(variant) << ")");
    DecodePlan plan;
    switch (mode) {
      case SplitMode::kPlanner:
      case SplitMode::kStablePrefix:
        plan = PlanDecodeVariant(batch, c.num_kv_heads, d, max_context, NumSms(), variant);
        break;
      case SplitMode::kOne:
        plan.num_splits = 1;
        break;
      case SplitMode::kSeven:
        plan.num_splits = 7;
        break;
      case SplitMode::kMax:
        plan.num_splits = kMaxDecodeSplits;
        break;
    }
    plan.variant = variant;

    const size_t workspace_bytes = DecodeWorkspaceBytes(plan, batch, c.num_q_heads, d);
    DeviceBuffer d_workspace(workspace_bytes);
    ASSERT_EQ(d_workspace.status(), cudaSuccess);
    std::vector<uint16_t> out(static_cast<size_t>(batch) * out_stride, kBf16Nan);
    ASSERT_EQ(
        cudaMemcpyAsync(d_out.get(), out.data(), out.size() * 2, cudaMemcpyHostToDevice, stream),
        cudaSuccess);
    if (workspace_bytes > 0) {
      // NaN everywhere: a partial the merge reads but the split kernel did
      // not write poisons the output.
      ASSERT_EQ(cudaMemsetAsync(d_workspace.get(), 0xff, workspace_bytes, stream), cudaSuccess);
    }
    if (stable) {
      ASSERT_EQ(cudaMemcpyAsync(d_cache.get(), stale.data(), stale.size() * 2,
                                cudaMemcpyHostToDevice, stream),
                cudaSuccess);
      bool first = true;
      for (const cpu::AttentionSequence& q : live) {
        const int64_t block_bytes = kv.block_stride_elems * 2;
        const int64_t at = q.block_table[(q.context_len - 1) / c.block_size] * block_bytes;
        ASSERT_EQ(LaunchPdlLateCopy(static_cast<char*>(d_cache.get()) + at,
                                    static_cast<const char*>(d_good.get()) + at,
                                    static_cast<size_t>(block_bytes), first ? kLateCopyDelayNs : 0,
                                    /*pdl=*/true, stream),
                  cudaSuccess);
        first = false;
      }
    }
    ASSERT_THAT(LaunchPagedDecodeAttention(args, plan, d_workspace.get(), workspace_bytes, stream),
                IsOk());
    ASSERT_EQ(
        cudaMemcpyAsync(out.data(), d_out.get(), out.size() * 2, cudaMemcpyDeviceToHost, stream),
        cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

    float max_error = 0.0f;
    int64_t mismatches = 0;
    for (int32_t s = 0; s < batch; ++s) {
      for (int64_t i = 0; i < out_stride; ++i) {
        const size_t at = static_cast<size_t>(s) * out_stride + i;
        if (i >= width) {
          if (out[at] != kBf16Nan) {
            if (mismatches++ == 0) {
              ADD_FAILURE() << "sequence " << s << " column " << i << " past the heads written";
            }
          }
          continue;
        }
        const float got = numeric::Bf16ToFloat(out[at]);
        const float expected = want[at];
        const float error = std::abs(got - expected);
        if (!(error <= 1e-2f + std::abs(expected) / 256.0f)) {
          if (mismatches++ == 0) {
            ADD_FAILURE() << "sequence " << s << " (context " << c.contexts[s] << ") head " << i / d
                          << " dim " << i % d << ": got " << got << ", want " << expected << ", "
                          << plan.num_splits << " splits";
          }
          continue;
        }
        max_error = std::max(max_error, error);
      }
    }
    EXPECT_EQ(mismatches, 0) << "outputs out of tolerance";
    std::printf("variant %d %-14s splits %3d  max abs error %g  mismatches %lld\n", variant,
                DecodeVariantName(variant), plan.num_splits, max_error,
                static_cast<long long>(mismatches));
    ::testing::Test::RecordProperty(absl::StrCat("max_error_variant_", variant),
                                    std::to_string(max_error));
  }
  cudaStreamDestroy(stream);
}

std::vector<int32_t> Contexts16() {
  return {1, 15, 16, 17, 100, 31, 33, 257, 4096, 511, 2, 1000, 48, 129, 700, 3};
}

std::vector<Case> Cases() {
  return {
      Case{"Dim64Gqa1Batch3", 64, 4, 4, {1, 15, 17}},
      Case{"Dim128Gqa1Batch3", 128, 2, 2, {16, 100, 1}},
      Case{"Dim64Gqa4Batch3", 64, 8, 2, {100, 17, 4096}},
      Case{"Dim128Gqa4Batch3", 128, 8, 2, {4096, 15, 16}},
      Case{"Dim64Gqa8Batch16", 64, 16, 2, Contexts16()},
      Case{"Dim128Gqa8Batch16", 128, 8, 1, Contexts16()},
      Case{"Dim128Gqa4Batch16", 128, 32, 8, Contexts16()},
      Case{"Dim128Gqa3Batch3", 128, 6, 2, {100, 1, 17}},
      Case{"Dim64Gqa8Context32k", 64, 8, 1, {32768}},
      Case{"Dim128Gqa4Context32k", 128, 8, 2, {32767}},
      Case{"Dim128Gqa1Context32k", 128, 2, 2, {32768, 33}},
      Case{"Dim128Gqa4PaddingSlot", 128, 8, 2, {0, 100, 0}},
      Case{"Dim128Gqa4Peaked", 128, 8, 2, {1500, 300, 4100}, 8.0f},
      Case{"Dim64Gqa8Peaked", 64, 16, 2, {3000, 1}, 8.0f},
      Case{"Dim128Block8", 128, 8, 2, {100, 7, 1000}, 1.0f, 8},
      Case{"Dim64Block32", 64, 8, 8, {100, 31, 1000}, 1.0f, 32},
      // Blocks of 48 (a multiple of 16: chunks inside one block, starting at
      // row 0, 16 or 32) and 24 (chunks across blocks: per-token lookups).
      Case{"Dim128Block48", 128, 8, 2, {100, 47, 1000, 48}, 1.0f, 48},
      Case{"Dim64Block24", 64, 16, 4, {25, 200, 1, 24}, 1.0f, 24},
      // The benchmark's shape (32 q / 8 kv heads) with a long context.
      Case{"Dim128Gqa4Heads32Context9k", 128, 32, 8, {9000, 16}},
      Case{"Dim128Gqa8Peaked", 128, 16, 2, {5000, 64}, 8.0f},
      // Head dims below the kernels' width (64 or 128), their dims masked:
      // 16/32/48 on the 64-wide kernels, 80/96/112 on the 128-wide ones,
      // with whole-block chunks and per-token lookups (blocks of 24).
      Case{"Dim16Gqa4Batch3", 16, 8, 2, {100, 17, 1000}},
      Case{"Dim32Gqa1Batch16", 32, 4, 4, Contexts16()},
      Case{"Dim48Gqa8Block24", 48, 16, 2, {25, 200, 1, 24}, 1.0f, 24},
      Case{"Dim80Gqa4Batch16", 80, 8, 2, Contexts16()},
      Case{"Dim96Gqa3Peaked", 96, 6, 2, {1500, 1, 4100}, 8.0f},
      Case{"Dim96Gqa4Block24", 96, 32, 8, {25, 9000, 24}, 1.0f, 24},
      Case{"Dim112Gqa8Context32k", 112, 8, 1, {32768, 33}},
      // 256-wide kernels (mma_w4_s2 for the variants that do not fit).
      Case{"Dim256Gqa2Batch16", 256, 8, 4, Contexts16()},
      Case{"Dim256Gqa8Block24", 256, 8, 1, {25, 5000, 24}, 1.0f, 24},
      Case{"Dim144Gqa4Peaked", 144, 8, 2, {1500, 1, 4100}, 8.0f},
      Case{"Dim240Gqa1Context32k", 240, 4, 4, {32768, 17}},
  };
}

std::string TestName(const ::testing::TestParamInfo<std::tuple<Case, SplitMode>>& info) {
  static const char* const kModes[] = {"Planned", "OneSplit", "SevenSplits", "MaxSplits",
                                       "StablePrefix"};
  return std::get<0>(info.param).name + kModes[static_cast<int>(std::get<1>(info.param))];
}

INSTANTIATE_TEST_SUITE_P(ShapesAndSplits, PagedDecodeAttentionTest,
                         ::testing::Combine(::testing::ValuesIn(Cases()),
                                            ::testing::Values(SplitMode::kPlanner, SplitMode::kOne,
                                                              SplitMode::kSeven, SplitMode::kMax,
                                                              SplitMode::kStablePrefix)),
                         TestName);

TEST(PagedDecodeAttentionBatchTest, EmptyBatchIsANoOp) {
  const PagedDecodeArgs args{.q_stride = 512,
                             .out_stride = 512,
                             .block_stride_elems = 2 * 16 * 128,
                             .value_offset_elems = 16 * 128,
                             .block_size = 16,
                             .num_q_heads = 4,
                             .num_kv_heads = 1,
                             .head_dim = 128,
                             .max_blocks_per_seq = 1,
                             .batch = 0,
                             .scale = 1.0f};
  EXPECT_THAT(LaunchPagedDecodeAttention(args, DecodePlan{}, nullptr, 0, nullptr), IsOk());
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
}

}  // namespace
}  // namespace trident::kernels::cuda
