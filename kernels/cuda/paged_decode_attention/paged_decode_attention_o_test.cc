// The output projection fused into decode attention
// (LaunchPagedDecodeAttentionO) against the plain cluster kernel's output
// times the weight, summed on the host in double: residual + bias +
// out · weightᵀ. The fused kernel multiplies the same bf16 attention bits
// the plain kernel writes (paged_decode_attention_test checks those against
// the CPU reference), so what is left is the f32 accumulation of at most
// 8 x 128 products per row and per kv head: |got - want| <= 1e-3 + 1e-4
// |want| (products of unit-scale outputs and 0.05-scale weights sum to
// ~0.5; an error of one row, head or stage is far above this). A second
// launch from the same residual must give the same bits (the kv heads'
// partials are added in a fixed order, and the tickets reset).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/paged_attention/paged_attention.h"
#include "kernels/cuda/paged_decode_attention/paged_decode_attention.h"
#include "kernels/cuda/testing/pdl_late_copy.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr uint32_t kSeed = 9191;

struct Case {
  std::string name;
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t context;
  int32_t block_size;
  int32_t hidden;
  bool bias = false;
  int64_t stride_pad = 0;  // weight row stride past its columns
  // Launched with pdl and stable_prefix behind late copies of the last
  // position's block (the cache held that position stale until then) and of
  // the residual: the kernel must read both after its wait.
  bool stable = false;
};

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    if (bytes > 0) status_ = cudaMalloc(&ptr_, bytes);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  cudaError_t status() const { return status_; }

 private:
  void* ptr_ = nullptr;
  cudaError_t status_ = cudaSuccess;
};

template <typename T>
cudaError_t Upload(const DeviceBuffer& d, const std::vector<T>& h, cudaStream_t stream) {
  return cudaMemcpyAsync(d.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, stream);
}

class DecodeOTest : public ::testing::TestWithParam<Case> {};

TEST_P(DecodeOTest, MatchesAttentionTimesWeight) {
  const Case& c = GetParam();
  constexpr int32_t d = 128;
  if (!DecodeOProjectionSupported(c.num_q_heads, c.num_kv_heads, d)) {
    GTEST_SKIP() << "needs an sm_90 device";
  }
  std::printf("seed %u case %s: %d clusters of %d per kv head\n", kSeed, c.name.c_str(),
              DecodeOProjectionParts(c.num_kv_heads, c.hidden), kDecodeOSplits);
  std::mt19937 rng(kSeed);
  std::normal_distribution<float> unit(0.0f, 1.0f);

  cpu::PagedKv kv;
  kv.dtype = numeric::DType::kBF16;
  kv.block_size = c.block_size;
  kv.num_kv_heads = c.num_kv_heads;
  kv.head_dim = d;
  const int64_t half = int64_t{c.num_kv_heads} * c.block_size * d;
  kv.value_offset_elems = half + 8;
  kv.block_stride_elems = 2 * half + 24;
  const int32_t blocks = (c.context + c.block_size - 1) / c.block_size;
  const int32_t max_blocks = blocks + 1;
  const int32_t num_blocks = blocks + 2;
  std::vector<uint16_t> cache(static_cast<size_t>(num_blocks) * kv.block_stride_elems, 0x7fc0);
  kv.base = cache.data();
  std::vector<int32_t> table(max_blocks, -1);
  std::vector<int32_t> physical(num_blocks);
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  for (int32_t b = 0; b < blocks; ++b) table[b] = physical[b];
  const int32_t kv_row = c.num_kv_heads * d;
  std::vector<float> k(static_cast<size_t>(c.context) * kv_row);
  std::vector<float> v(k.size());
  for (float& x : k) x = unit(rng);
  for (float& x : v) x = unit(rng);
  std::vector<int64_t> slots(c.context);
  for (int32_t p = 0; p < c.context; ++p) {
    slots[p] = int64_t{table[p / c.block_size]} * c.block_size + p % c.block_size;
  }
  cpu::AppendKv(kv, k.data(), kv_row, v.data(), kv_row, slots.data(), c.context);

  const int64_t width = int64_t{c.num_q_heads} * d;
  std::vector<uint16_t> q(width);
  for (uint16_t& x : q) x = numeric::FloatToBf16(unit(rng));
  const int64_t stride = width + c.stride_pad;
  std::vector<uint16_t> weight(static_cast<size_t>(c.hidden) * stride);
  for (uint16_t& x : weight) x = numeric::FloatToBf16(0.05f * unit(rng));
  std::vector<float> bias(c.bias ? c.hidden : 0);
  for (float& x : bias) x = unit(rng);
  std::vector<float> residual(c.hidden);
  for (float& x : residual) x = unit(rng);
  const std::vector<int32_t> lens = {c.context};
  // The cache with the last position's K and V rows NaN.
  std::vector<uint16_t> stale = cache;
  for (int32_t h = 0; h < c.num_kv_heads; ++h) {
    const int32_t t = c.context - 1;
    const int64_t at = int64_t{table[t / c.block_size]} * kv.block_stride_elems +
                       (int64_t{h} * c.block_size + t % c.block_size) * d;
    for (int64_t offset : {int64_t{0}, kv.value_offset_elems}) {
      std::fill_n(stale.begin() + at + offset, d, uint16_t{0x7fc0});
    }
  }

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  DeviceBuffer d_cache(cache.size() * 2), d_q(q.size() * 2), d_out(width * 2),
      d_table(table.size() * 4), d_lens(4), d_weight(weight.size() * 2), d_bias(bias.size() * 4),
      d_residual(residual.size() * 4), d_good_residual(residual.size() * 4),
      d_good_cache(cache.size() * 2),
      d_ws(DecodeOProjectionWorkspaceBytes(c.num_kv_heads, c.hidden));
  for (const DeviceBuffer* b : {&d_cache, &d_q, &d_out, &d_table, &d_lens, &d_weight, &d_bias,
                                &d_residual, &d_good_residual, &d_good_cache, &d_ws}) {
    ASSERT_EQ(b->status(), cudaSuccess);
  }
  for (cudaError_t e :
       {Upload(d_cache, cache, stream), Upload(d_good_cache, cache, stream), Upload(d_q, q, stream),
        Upload(d_table, table, stream), Upload(d_lens, lens, stream),
        Upload(d_weight, weight, stream), Upload(d_bias, bias, stream),
        Upload(d_good_residual, residual, stream),
        cudaMemsetAsync(d_ws.get(), 0, DecodeOProjectionWorkspaceBytes(c.num_kv_heads, c.hidden),
                        stream)}) {
    ASSERT_EQ(e, cudaSuccess);
  }
  PagedDecodeArgs args{.q = d_q.get(),
                       .q_stride = width,
                       .out = d_out.get(),
                       .out_stride = width,
                       .kv_base = d_cache.get(),
                       .block_stride_elems = kv.block_stride_elems,
                       .value_offset_elems = kv.value_offset_elems,
                       .block_size = c.block_size,
                       .num_q_heads = c.num_q_heads,
                       .num_kv_heads = c.num_kv_heads,
                       .head_dim = d,
                       .block_tables = d_table.get<int32_t>(),
                       .max_blocks_per_seq = max_blocks,
                       .context_lens = d_lens.get<int32_t>(),
                       .batch = 1,
                       .scale = 1.0f / std::sqrt(static_cast<float>(d))};

  // The plain cluster kernel's output: the bits the fused one multiplies.
  const DecodePlan plan{kDecodeOSplits, kClusterDecodeVariant};
  ASSERT_THAT(LaunchPagedDecodeAttention(args, plan, nullptr, 0, stream), IsOk());
  std::vector<uint16_t> out(width);
  ASSERT_EQ(cudaMemcpyAsync(out.data(), d_out.get(), width * 2, cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<double> want(c.hidden);
  for (int32_t n = 0; n < c.hidden; ++n) {
    double sum = residual[n] + (c.bias ? bias[n] : 0.0);
    for (int64_t j = 0; j < width; ++j) {
      sum += double{numeric::Bf16ToFloat(out[j])} *
             numeric::Bf16ToFloat(weight[static_cast<size_t>(n) * stride + j]);
    }
    want[n] = sum;
  }

  DecodeOProjection o{.weight = d_weight.get(),
                      .weight_stride = stride,
                      .bias = c.bias ? d_bias.get<float>() : nullptr,
                      .residual = d_residual.get<float>(),
                      .hidden = c.hidden,
                      .workspace = d_ws.get(),
                      .workspace_bytes = DecodeOProjectionWorkspaceBytes(c.num_kv_heads, c.hidden)};
  args.pdl = c.stable;
  args.stable_prefix = c.stable;
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(::testing::Message() << "run " << run);
    std::vector<float> got(c.hidden, NAN);
    if (c.stable) {
      // The last position and the residual are stale (NaN) until the late
      // copies write them.
      const int64_t block_bytes = kv.block_stride_elems * 2;
      const int64_t at = int64_t{table[(c.context - 1) / c.block_size]} * block_bytes;
      ASSERT_EQ(Upload(d_cache, stale, stream), cudaSuccess);
      ASSERT_EQ(Upload(d_residual, got, stream), cudaSuccess);
      ASSERT_EQ(LaunchPdlLateCopy(d_cache.get<char>() + at, d_good_cache.get<char>() + at,
                                  block_bytes, 200000, /*pdl=*/true, stream),
                cudaSuccess);
      ASSERT_EQ(LaunchPdlLateCopy(d_residual.get(), d_good_residual.get(), residual.size() * 4, 0,
                                  /*pdl=*/true, stream),
                cudaSuccess);
    } else {
      ASSERT_EQ(Upload(d_residual, residual, stream), cudaSuccess);
    }
    ASSERT_THAT(LaunchPagedDecodeAttentionO(args, o, stream), IsOk());
    ASSERT_EQ(cudaMemcpyAsync(got.data(), d_residual.get(), got.size() * 4, cudaMemcpyDeviceToHost,
                              stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    int64_t mismatches = 0;
    for (int32_t n = 0; n < c.hidden; ++n) {
      const double error = std::abs(got[n] - want[n]);
      if (!(error <= 1e-3 + 1e-4 * std::abs(want[n])) && ++mismatches <= 3) {
        ADD_FAILURE() << "row " << n << ": got " << got[n] << ", want " << want[n];
      }
    }
    EXPECT_EQ(mismatches, 0);
    if (run == 0) {
      first = got;
    } else {
      EXPECT_EQ(std::memcmp(first.data(), got.data(), got.size() * 4), 0) << "not deterministic";
    }
  }
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DecodeOTest,
    ::testing::Values(Case{"llama8b_512", 32, 8, 512, 16, 4096},
                      Case{"llama8b_700_bias_stable", 32, 8, 700, 16, 4096, true, 0, true},
                      Case{"group8_block5_hidden1000", 64, 8, 37, 5, 1000, false, 24},
                      Case{"group1_one_token", 8, 8, 1, 16, 256, true},
                      Case{"group2_long", 4, 2, 3000, 32, 4096, true, 8},
                      Case{"group4_stable_short", 8, 2, 17, 16, 2048, false, 0, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(DecodeOArgsTest, RefusesWhatItCannotRun) {
  PagedDecodeArgs args{.q = reinterpret_cast<void*>(16),
                       .q_stride = 4096,
                       .out = reinterpret_cast<void*>(16),
                       .out_stride = 4096,
                       .kv_base = reinterpret_cast<void*>(16),
                       .block_stride_elems = 2 * 8 * 16 * 128,
                       .value_offset_elems = 8 * 16 * 128,
                       .block_size = 16,
                       .num_q_heads = 32,
                       .num_kv_heads = 8,
                       .head_dim = 128,
                       .block_tables = reinterpret_cast<const int32_t*>(16),
                       .max_blocks_per_seq = 4,
                       .context_lens = reinterpret_cast<const int32_t*>(16),
                       .batch = 2};
  DecodeOProjection o{.weight = reinterpret_cast<void*>(16),
                      .weight_stride = 4096,
                      .residual = reinterpret_cast<float*>(16),
                      .hidden = 4096,
                      .workspace = reinterpret_cast<void*>(16),
                      .workspace_bytes = DecodeOProjectionWorkspaceBytes(8, 4096)};
  EXPECT_THAT(LaunchPagedDecodeAttentionO(args, o, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));  // batch 2
  args.batch = 1;
  args.kv_dtype = DecodeKvDtype::kFp8E4M3;
  EXPECT_THAT(LaunchPagedDecodeAttentionO(args, o, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  args.kv_dtype = DecodeKvDtype::kBf16;
  o.weight_stride = 4000;  // below the 4096 columns
  EXPECT_THAT(LaunchPagedDecodeAttentionO(args, o, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  o.weight_stride = 4096;
  o.workspace_bytes = 16;
  EXPECT_THAT(LaunchPagedDecodeAttentionO(args, o, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(DecodeOProjectionSupported(32, 8, 64));
  EXPECT_FALSE(DecodeOProjectionSupported(24, 8, 128));  // group 3
}

}  // namespace
}  // namespace trident::kernels::cuda
