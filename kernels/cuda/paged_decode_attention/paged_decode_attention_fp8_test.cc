// GPU decode attention over the FP8 E4M3 cache against the CPU reference
// (PagedAttentionReference, textbook softmax in double) over the same stored
// values: the cache is written by cpu::AppendKvFp8, and the reference reads
// its dequantized K and V (cpu::ReadKvFp8) from an f32 copy. Every kernel
// variant, with the planner's, one and seven splits.
//
// Tolerance: as the bf16 test's, |got - want| <= 1e-2 + 2^-8 |want|: the
// kernel's q and probabilities are fp16 (finer than bf16) and its sums fp32;
// for wgmma_fp8, whose q and probabilities are two E4M3 terms each,
// 2e-2 + 2^-7 |want|.
// Every byte the cache does not hold for a sequence is 0x7f, an E4M3 NaN, so
// a read past a context that is not masked poisons the output. The error of
// FP8 itself (against attention over the unquantized values) is printed.

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
#include "kernels/cuda/paged_decode_attention/paged_decode_attention.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::testing::IsOk;

constexpr uint32_t kSeed = 8080;
constexpr uint16_t kBf16Nan = 0x7fc0;

struct Case {
  std::string name;
  int32_t head_dim;
  int32_t num_q_heads;
  int32_t num_kv_heads;
  std::vector<int32_t> contexts;
  float q_scale = 1.0f;
  int32_t block_size = 16;
};

enum class SplitMode { kPlanner, kOne, kSeven };

int32_t NumSms() {
  int device = 0;
  int sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 0;
  }
  return sms;
}

template <typename T>
void* Upload(const std::vector<T>& host) {
  void* device = nullptr;
  if (cudaMalloc(&device, host.size() * sizeof(T) + 16) != cudaSuccess) return nullptr;
  if (cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) !=
      cudaSuccess) {
    cudaFree(device);
    return nullptr;
  }
  return device;
}

// The FP8 cache of a batch, its f32 dequantized twin and the original f32
// values, with the block tables all three share.
struct Caches {
  std::vector<unsigned char> fp8;
  cpu::PagedKvFp8 fp8_kv;
  std::vector<float> stored;  // Dequantized.
  std::vector<float> exact;   // Before quantization.
  cpu::PagedKv f32_kv;        // Layout of stored and exact (base unset).
  std::vector<int32_t> tables;
  int32_t max_blocks = 1;
  std::vector<cpu::AttentionSequence> live;
};

Caches BuildCaches(const Case& c, std::mt19937& rng) {
  Caches out;
  std::normal_distribution<float> unit(0.0f, 1.0f);
  const int32_t batch = static_cast<int32_t>(c.contexts.size());
  int32_t num_blocks = 3;
  for (int32_t ctx : c.contexts) {
    const int32_t blocks = (ctx + c.block_size - 1) / c.block_size;
    out.max_blocks = std::max(out.max_blocks, blocks + 1);
    num_blocks += blocks;
  }
  const int64_t block_bytes = cpu::Fp8BlockBytes(c.block_size, c.num_kv_heads, c.head_dim);
  out.fp8.assign(static_cast<size_t>(num_blocks * block_bytes), 0x7f);
  out.fp8_kv = cpu::DensePagedKvFp8(out.fp8.data(), c.block_size, c.num_kv_heads, c.head_dim);
  out.f32_kv.dtype = numeric::DType::kF32;
  out.f32_kv.block_size = c.block_size;
  out.f32_kv.num_kv_heads = c.num_kv_heads;
  out.f32_kv.head_dim = c.head_dim;
  const int64_t half = static_cast<int64_t>(c.num_kv_heads) * c.block_size * c.head_dim;
  out.f32_kv.value_offset_elems = half;
  out.f32_kv.block_stride_elems = 2 * half;
  out.stored.assign(static_cast<size_t>(num_blocks * 2 * half), 0.0f);
  out.exact = out.stored;
  std::vector<int32_t> physical(num_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  out.tables.assign(static_cast<size_t>(batch) * out.max_blocks, -1);
  const int32_t kv_row = c.num_kv_heads * c.head_dim;
  int32_t next_block = 0;
  for (int32_t s = 0; s < batch; ++s) {
    const int32_t ctx = c.contexts[s];
    int32_t* table = out.tables.data() + static_cast<size_t>(s) * out.max_blocks;
    for (int32_t b = 0; b < (ctx + c.block_size - 1) / c.block_size; ++b) {
      table[b] = physical[next_block++];
    }
    std::vector<float> k(static_cast<size_t>(ctx) * kv_row), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      // Rows of different magnitudes: per-token scales matter.
      const float magnitude = std::ldexp(1.0f, static_cast<int>(i / c.head_dim % 5) - 2);
      k[i] = numeric::Bf16ToFloat(numeric::FloatToBf16(unit(rng) * magnitude));
      v[i] = numeric::Bf16ToFloat(numeric::FloatToBf16(unit(rng) * magnitude));
    }
    std::vector<int64_t> slots(ctx);
    for (int32_t p = 0; p < ctx; ++p) {
      slots[p] = static_cast<int64_t>(table[p / c.block_size]) * c.block_size + p % c.block_size;
    }
    cpu::AppendKvFp8(out.fp8_kv, k.data(), kv_row, v.data(), kv_row, slots.data(), ctx);
    cpu::PagedKv exact_kv = out.f32_kv;
    exact_kv.base = out.exact.data();
    cpu::AppendKv(exact_kv, k.data(), kv_row, v.data(), kv_row, slots.data(), ctx);
    std::vector<float> kd(c.head_dim), vd(c.head_dim);
    for (int32_t p = 0; p < ctx; ++p) {
      const int64_t block = slots[p] / c.block_size;
      const int32_t slot = static_cast<int32_t>(slots[p] % c.block_size);
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        cpu::ReadKvFp8(out.fp8_kv, block, slot, h, kd.data(), vd.data());
        const int64_t at =
            block * 2 * half + (static_cast<int64_t>(h) * c.block_size + slot) * c.head_dim;
        std::copy(kd.begin(), kd.end(), out.stored.begin() + at);
        std::copy(vd.begin(), vd.end(), out.stored.begin() + at + half);
      }
    }
    if (ctx > 0) out.live.push_back(cpu::AttentionSequence{table, ctx, 1, s});
  }
  return out;
}

class PagedDecodeFp8Test : public ::testing::TestWithParam<std::tuple<Case, SplitMode>> {};

TEST_P(PagedDecodeFp8Test, MatchesCpuReferenceOverTheStoredValues) {
  const Case& c = std::get<0>(GetParam());
  const SplitMode mode = std::get<1>(GetParam());
  std::printf("seed %u case %s\n", kSeed, c.name.c_str());
  std::mt19937 rng(kSeed);
  std::normal_distribution<float> unit(0.0f, 1.0f);
  const int32_t batch = static_cast<int32_t>(c.contexts.size());
  const int32_t d = c.head_dim;
  Caches caches = BuildCaches(c, rng);

  const int64_t width = static_cast<int64_t>(c.num_q_heads) * d;
  const int64_t q_stride = width + 2 * c.num_kv_heads * d;
  const int64_t out_stride = width + 8;
  std::vector<uint16_t> q_bf16(static_cast<size_t>(batch) * q_stride);
  std::vector<float> q_float(q_bf16.size());
  for (size_t i = 0; i < q_bf16.size(); ++i) {
    q_bf16[i] = numeric::FloatToBf16(unit(rng) * c.q_scale);
    q_float[i] = numeric::Bf16ToFloat(q_bf16[i]);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<float> want(static_cast<size_t>(batch) * out_stride, 0.0f);
  std::vector<float> exact(want.size(), 0.0f);
  cpu::PagedKv kv = caches.f32_kv;
  kv.base = caches.stored.data();
  cpu::PagedAttentionReference(kv, q_float.data(), q_stride, c.num_q_heads, caches.live, scale,
                               want.data(), out_stride);
  kv.base = caches.exact.data();
  cpu::PagedAttentionReference(kv, q_float.data(), q_stride, c.num_q_heads, caches.live, scale,
                               exact.data(), out_stride);
  int32_t max_context = 0;
  for (int32_t ctx : c.contexts) max_context = std::max(max_context, ctx);

  void* d_cache = Upload(caches.fp8);
  void* d_q = Upload(q_bf16);
  void* d_tables = Upload(caches.tables);
  void* d_lens = Upload(c.contexts);
  void* d_out = nullptr;
  ASSERT_EQ(cudaMalloc(&d_out, static_cast<size_t>(batch) * out_stride * 2), cudaSuccess);
  ASSERT_TRUE(d_cache != nullptr && d_q != nullptr && d_tables != nullptr && d_lens != nullptr);
  const PagedDecodeArgs args{.q = d_q,
                             .q_stride = q_stride,
                             .out = d_out,
                             .out_stride = out_stride,
                             .kv_base = d_cache,
                             .kv_dtype = DecodeKvDtype::kFp8E4M3,
                             .block_stride_elems = caches.fp8_kv.block_stride_bytes,
                             .value_offset_elems = caches.fp8_kv.value_offset_bytes,
                             .scale_offset_elems = caches.fp8_kv.scale_offset_bytes,
                             .block_size = c.block_size,
                             .num_q_heads = c.num_q_heads,
                             .num_kv_heads = c.num_kv_heads,
                             .head_dim = d,
                             .block_tables = static_cast<const int32_t*>(d_tables),
                             .max_blocks_per_seq = caches.max_blocks,
                             .context_lens = static_cast<const int32_t*>(d_lens),
                             .batch = batch,
                             .scale = scale};
  for (int32_t variant = 0; variant < kNumDecodeVariants; ++variant) {
    SCOPED_TRACE(::testing::Message() << "variant " << DecodeVariantName(variant));
    DecodePlan plan;
    if (mode == SplitMode::kPlanner) {
      plan = PlanDecodeVariant(batch, c.num_kv_heads, d, max_context, NumSms(), variant);
    } else {
      plan.num_splits = mode == SplitMode::kOne ? 1 : 7;
    }
    plan.variant = variant;
    const size_t workspace_bytes = DecodeWorkspaceBytes(plan, batch, c.num_q_heads, d);
    void* d_workspace = nullptr;
    if (workspace_bytes > 0) {
      ASSERT_EQ(cudaMalloc(&d_workspace, workspace_bytes), cudaSuccess);
      ASSERT_EQ(cudaMemset(d_workspace, 0xff, workspace_bytes), cudaSuccess);
    }
    // Hopper's kernel carries q and the probabilities as two E4M3 terms (about
    // 8 significant bits, against fp16's 11): twice the relative tolerance.
    const bool wgmma = variant == kWgmmaFp8DecodeVariant;
    const float abs_tolerance = wgmma ? 2e-2f : 1e-2f;
    const float rel_tolerance = wgmma ? 1.0f / 128.0f : 1.0f / 256.0f;
    std::vector<uint16_t> out(static_cast<size_t>(batch) * out_stride, kBf16Nan);
    ASSERT_EQ(cudaMemcpy(d_out, out.data(), out.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_THAT(LaunchPagedDecodeAttention(args, plan, d_workspace, workspace_bytes, nullptr),
                IsOk());
    ASSERT_EQ(cudaMemcpy(out.data(), d_out, out.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(d_workspace);
    float max_error = 0.0f;
    float max_fp8_error = 0.0f;
    double sum_fp8_error = 0.0;
    int64_t mismatches = 0;
    for (int32_t s = 0; s < batch; ++s) {
      for (int64_t i = 0; i < out_stride; ++i) {
        const size_t at = static_cast<size_t>(s) * out_stride + i;
        if (i >= width) {
          if (out[at] != kBf16Nan && mismatches++ == 0) {
            ADD_FAILURE() << "sequence " << s << " column " << i << " past the heads written";
          }
          continue;
        }
        const float got = numeric::Bf16ToFloat(out[at]);
        const float error = std::abs(got - want[at]);
        if (!(error <= abs_tolerance + std::abs(want[at]) * rel_tolerance)) {
          if (mismatches++ == 0) {
            ADD_FAILURE() << "sequence " << s << " (context " << c.contexts[s] << ") head " << i / d
                          << " dim " << i % d << ": got " << got << ", want " << want[at] << ", "
                          << plan.num_splits << " splits";
          }
          continue;
        }
        max_error = std::max(max_error, error);
        max_fp8_error = std::max(max_fp8_error, std::abs(got - exact[at]));
        sum_fp8_error += std::abs(got - exact[at]);
      }
    }
    EXPECT_EQ(mismatches, 0) << "outputs out of tolerance";
    std::printf(
        "variant %d %-14s splits %3d  max abs error %g  against unquantized: max %g mean %g\n",
        variant, DecodeVariantName(variant), plan.num_splits, max_error, max_fp8_error,
        sum_fp8_error / static_cast<double>(batch * width));
  }
  for (void* p : {d_cache, d_q, d_tables, d_lens, d_out}) cudaFree(p);
}

std::vector<Case> Cases() {
  const std::vector<int32_t> mixed = {1, 15, 16, 17, 100, 31, 33, 257, 4096, 511, 2, 1000, 48};
  return {
      Case{"Dim128Gqa4Batch13", 128, 32, 8, mixed},
      Case{"Dim64Gqa8Batch13", 64, 16, 2, mixed},
      Case{"Dim256Gqa2Batch13", 256, 8, 4, mixed},
      Case{"Dim128Gqa1PaddingSlot", 128, 2, 2, {0, 100, 17}},
      Case{"Dim128Gqa4Peaked", 128, 8, 2, {1500, 300, 4100}, 8.0f},
      Case{"Dim128Gqa4Context32k", 128, 8, 2, {32767, 33}},
      Case{"Dim128Block32", 128, 8, 2, {100, 31, 1000}, 1.0f, 32},
      Case{"Dim64Block48", 64, 8, 8, {100, 47, 1000, 48}, 1.0f, 48},
      Case{"Dim16Gqa4", 16, 8, 2, {100, 17, 1000}},
      Case{"Dim80Gqa4", 80, 8, 2, mixed},
      Case{"Dim96Gqa3Peaked", 96, 6, 2, {1500, 1, 4100}, 8.0f},
      Case{"Dim240Gqa1", 240, 4, 4, {5000, 17}},
  };
}

std::string TestName(const ::testing::TestParamInfo<std::tuple<Case, SplitMode>>& info) {
  static const char* const kModes[] = {"Planned", "OneSplit", "SevenSplits"};
  return std::get<0>(info.param).name + kModes[static_cast<int>(std::get<1>(info.param))];
}

INSTANTIATE_TEST_SUITE_P(ShapesAndSplits, PagedDecodeFp8Test,
                         ::testing::Combine(::testing::ValuesIn(Cases()),
                                            ::testing::Values(SplitMode::kPlanner, SplitMode::kOne,
                                                              SplitMode::kSeven)),
                         TestName);

}  // namespace
}  // namespace trident::kernels::cuda
