// Gemm::RunChain against the same projections launched one by one: a
// decode layer's o projection (into the f32 residual), the norm + gate/up +
// SwiGLU, down (into the residual) and the next layer's norm + q/k/v + RoPE
// + KV store, as one kernel. The same bits in every output, the counters
// left for the next launch, and refused where it does not fuse.

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "kernels/cuda/arch/arch.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/testing/to_device.h"

namespace trident::kernels::cuda {
namespace {

using ::trident::kernels::cuda::testing::ToDevice;
using ::trident::testing::IsOk;

struct LayerShape {
  int32_t hidden, inter, q_heads, kv_heads, head_dim;
  bool bias;
  int steps;  // 3: o, gate/up, down; 4: and the next q/k/v
};

constexpr int32_t kBlockSize = 16;
constexpr int32_t kBlocks = 4;

template <typename T>
std::vector<T> ToHost(const T* device, size_t count) {
  std::vector<T> host(count);
  EXPECT_EQ(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

// One layer's weights and one run's outputs, in device memory.
struct Layer {
  uint16_t *o, *gate_up, *down, *qkv;
  float *o_bias = nullptr, *gate_up_bias = nullptr, *down_bias = nullptr, *qkv_bias = nullptr;
  float *post_norm, *input_norm, *inv_freq;
  int32_t* position;
  int64_t* slot;
};

struct Outputs {
  float* residual;
  uint16_t *act, *qkv, *cache;
};

std::vector<uint16_t> RandomBf16(std::mt19937& rng, size_t count, float scale) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> v(count);
  for (auto& e : v) e = numeric::FloatToBf16(scale * normal(rng));
  return v;
}

std::vector<float> RandomF32(std::mt19937& rng, size_t count, float mean, float scale) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(count);
  for (auto& e : v) e = mean + scale * normal(rng);
  return v;
}

// The chain's steps over `out`, with the attention output `attn`.
std::vector<GemmChainStep> Steps(const LayerShape& s, const Layer& l, const uint16_t* attn,
                                 const Outputs& out) {
  const int64_t h = s.hidden, inter = s.inter, q_out = int64_t{s.q_heads} * s.head_dim;
  const int64_t qkv_n = int64_t{s.q_heads + 2 * s.kv_heads} * s.head_dim;
  std::vector<GemmChainStep> steps(s.steps);
  steps[0].args = {attn, q_out, l.o, l.o_bias, out.residual, h, 1, h, q_out};
  steps[0].args.y_dtype = numeric::DType::kF32;
  steps[0].args.accumulate = true;
  steps[1].kind = GemmChainStep::Kind::kSiluMul;
  steps[1].args = {out.residual, h, l.gate_up, l.gate_up_bias, out.act, inter, 1, 2 * inter, h};
  steps[1].args.norm_weight = l.post_norm;
  steps[1].args.norm_eps = 1e-5f;
  steps[2].args = {out.act, inter, l.down, l.down_bias, out.residual, h, 1, h, inter};
  steps[2].args.y_dtype = numeric::DType::kF32;
  steps[2].args.accumulate = true;
  if (s.steps == 4) {
    steps[3].kind = GemmChainStep::Kind::kRope;
    steps[3].args = {out.residual, h, l.qkv, l.qkv_bias, out.qkv, qkv_n, 1, qkv_n, h};
    steps[3].args.norm_weight = l.input_norm;
    steps[3].args.norm_eps = 1e-5f;
    const int64_t kv_elems = int64_t{s.kv_heads} * kBlockSize * s.head_dim;
    steps[3].rope = {l.position, l.inv_freq, s.q_heads,    s.kv_heads, s.head_dim, out.cache,
                     kBlocks,    kBlockSize, 2 * kv_elems, kv_elems,   l.slot};
  }
  return steps;
}

class GemmChainTest : public ::testing::TestWithParam<LayerShape> {};

TEST_P(GemmChainTest, MatchesTheStepsOneByOne) {
  const LayerShape s = GetParam();
  if (!CurrentDeviceIsSm90()) GTEST_SKIP() << "the chain is Hopper's GEMV's";
  const uint32_t seed = 11;
  std::printf("hidden %d inter %d heads %d/%d head_dim %d bias %d steps %d seed %u\n", s.hidden,
              s.inter, s.q_heads, s.kv_heads, s.head_dim, s.bias, s.steps, seed);
  std::mt19937 rng(seed);
  const int64_t h = s.hidden, inter = s.inter, q_out = int64_t{s.q_heads} * s.head_dim;
  const int64_t qkv_n = int64_t{s.q_heads + 2 * s.kv_heads} * s.head_dim;
  const int64_t cache_elems = int64_t{kBlocks} * 2 * s.kv_heads * kBlockSize * s.head_dim;
  Layer l;
  l.o = ToDevice(RandomBf16(rng, q_out * h, 1.0f / 32));
  l.gate_up = ToDevice(RandomBf16(rng, 2 * inter * h, 1.0f / 32));
  l.down = ToDevice(RandomBf16(rng, h * inter, 1.0f / 64));
  l.qkv = ToDevice(RandomBf16(rng, qkv_n * h, 1.0f / 32));
  if (s.bias) {
    l.o_bias = ToDevice(RandomF32(rng, h, 0.0f, 1.0f));
    l.gate_up_bias = ToDevice(RandomF32(rng, 2 * inter, 0.0f, 1.0f));
    l.down_bias = ToDevice(RandomF32(rng, h, 0.0f, 1.0f));
    l.qkv_bias = ToDevice(RandomF32(rng, qkv_n, 0.0f, 1.0f));
  }
  l.post_norm = ToDevice(RandomF32(rng, h, 1.0f, 0.1f));
  l.input_norm = ToDevice(RandomF32(rng, h, 1.0f, 0.1f));
  std::vector<float> inv_freq(s.head_dim / 2);
  for (int i = 0; i < s.head_dim / 2; ++i) {
    inv_freq[i] = 1.0f / std::pow(500000.0f, 2.0f * i / s.head_dim);
  }
  l.inv_freq = ToDevice(inv_freq);
  l.position = ToDevice(std::vector<int32_t>{41});
  l.slot = ToDevice(std::vector<int64_t>{41});
  const std::vector<uint16_t> attn_host = RandomBf16(rng, q_out, 1.0f);
  const std::vector<float> residual0 = RandomF32(rng, h, 0.0f, 3.0f);
  const std::vector<uint16_t> garbage = RandomBf16(rng, cache_elems, 1.0f);
  uint16_t* attn = ToDevice(attn_host);
  auto fresh = [&] {
    return Outputs{ToDevice(residual0), ToDevice(std::vector<uint16_t>(inter, 0xffff)),
                   ToDevice(std::vector<uint16_t>(qkv_n, 0xffff)), ToDevice(garbage)};
  };
  const Outputs want = fresh();
  auto gemm = Gemm::Create();
  ASSERT_THAT(gemm.status(), IsOk());
  const std::vector<GemmChainStep> one_by_one = Steps(s, l, attn, want);
  ASSERT_THAT((*gemm)->Run(one_by_one[0].args, nullptr), IsOk());
  ASSERT_THAT((*gemm)->RunSiluMul(one_by_one[1].args, nullptr), IsOk());
  ASSERT_THAT((*gemm)->Run(one_by_one[2].args, nullptr), IsOk());
  if (s.steps == 4) {
    ASSERT_THAT((*gemm)->RunRope(one_by_one[3].args, one_by_one[3].rope, nullptr), IsOk());
  }
  const std::vector<float> residual_want = ToHost(want.residual, h);
  const std::vector<uint16_t> act_want = ToHost(want.act, inter);
  const std::vector<uint16_t> qkv_want = ToHost(want.qkv, qkv_n);
  const std::vector<uint16_t> cache_want = ToHost(want.cache, cache_elems);
  ASSERT_NE(residual_want, residual0) << "the steps wrote nothing";
  for (const float v : residual_want) ASSERT_TRUE(std::isfinite(v)) << "the steps' residual";
  // Three launches in a row on fresh outputs: the counters the chain
  // leaves must serve the next launch that takes them.
  for (int run = 0; run < 3; ++run) {
    SCOPED_TRACE(run);
    const Outputs got = fresh();
    const std::vector<GemmChainStep> chain = Steps(s, l, attn, got);
    ASSERT_TRUE((*gemm)->FusesChain(chain.data(), s.steps));
    ASSERT_THAT((*gemm)->RunChain(chain.data(), s.steps, nullptr), IsOk());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(ToHost(got.residual, h), residual_want) << "the residual differs";
    EXPECT_EQ(ToHost(got.act, inter), act_want) << "the activation differs";
    if (s.steps == 4) {
      EXPECT_EQ(ToHost(got.qkv, qkv_n), qkv_want) << "q/k/v differs";
      const std::vector<uint16_t> cache = ToHost(got.cache, cache_elems);
      EXPECT_EQ(cache, cache_want) << "the KV cache differs";
      EXPECT_NE(cache, garbage) << "nothing stored in the KV cache";
    }
    for (void* p : {static_cast<void*>(got.residual), static_cast<void*>(got.act),
                    static_cast<void*>(got.qkv), static_cast<void*>(got.cache)}) {
      cudaFree(p);
    }
  }
  for (void* p :
       {static_cast<void*>(want.residual), static_cast<void*>(want.act),
        static_cast<void*>(want.qkv), static_cast<void*>(want.cache), static_cast<void*>(attn),
        static_cast<void*>(l.o), static_cast<void*>(l.gate_up), static_cast<void*>(l.down),
        static_cast<void*>(l.qkv), static_cast<void*>(l.o_bias), static_cast<void*>(l.gate_up_bias),
        static_cast<void*>(l.down_bias), static_cast<void*>(l.qkv_bias),
        static_cast<void*>(l.post_norm), static_cast<void*>(l.input_norm),
        static_cast<void*>(l.inv_freq), static_cast<void*>(l.position),
        static_cast<void*>(l.slot)}) {
    cudaFree(p);
  }
}

// The 8B shape's layer, with and without the next q/k/v; a Qwen-like small
// one with biases (items past n in the last CTAs: 136 outputs of 8 rows);
// one with fewer items than CTAs in every step.
INSTANTIATE_TEST_SUITE_P(Shapes, GemmChainTest,
                         ::testing::Values(LayerShape{4096, 14336, 32, 8, 128, false, 4},
                                           LayerShape{4096, 14336, 32, 8, 128, false, 3},
                                           LayerShape{896, 4864, 14, 2, 64, true, 4},
                                           LayerShape{136, 200, 2, 1, 16, true, 4}));

TEST(GemmChainRefusedTest, WhereItDoesNotFuse) {
  if (!CurrentDeviceIsSm90()) GTEST_SKIP() << "the chain is Hopper's GEMV's";
  auto gemm = Gemm::Create();
  ASSERT_THAT(gemm.status(), IsOk());
  void* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 1 << 20), cudaSuccess);
  GemmChainStep step;
  step.args = {buffer, 256, buffer, nullptr, buffer, 64, 1, 64, 256};
  step.args.y_dtype = numeric::DType::kF32;
  step.args.accumulate = true;
  const std::vector<GemmChainStep> one(1, step), five(5, step);
  EXPECT_TRUE((*gemm)->FusesChain(one.data(), 1));
  // Kinds other than a decode layer's: bf16 out first, two f32 steps.
  GemmChainStep bf16 = step;
  bf16.args.y_dtype = numeric::DType::kBF16;
  EXPECT_FALSE((*gemm)->FusesChain(&bf16, 1));
  const std::vector<GemmChainStep> two_plain(2, step);
  EXPECT_FALSE((*gemm)->FusesChain(two_plain.data(), 2));
  EXPECT_FALSE((*gemm)->FusesChain(five.data(), 5));
  EXPECT_FALSE((*gemm)->FusesChain(one.data(), 0));
  EXPECT_EQ((*gemm)->RunChain(five.data(), 5, nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
  GemmChainStep two_rows = step;
  two_rows.args.m = 2;
  EXPECT_EQ((*gemm)->RunChain(&two_rows, 1, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  GemmChainStep null_x = step;
  null_x.args.x = nullptr;
  EXPECT_EQ((*gemm)->RunChain(&null_x, 1, nullptr).code(), absl::StatusCode::kInvalidArgument);
  auto fixed_items = Gemm::Create({.gemv_dynamic = false});
  ASSERT_THAT(fixed_items.status(), IsOk());
  EXPECT_FALSE((*fixed_items)->FusesChain(one.data(), 1));
  cudaFree(buffer);
}

}  // namespace
}  // namespace trident::kernels::cuda
