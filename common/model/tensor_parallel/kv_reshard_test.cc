#include "common/model/tensor_parallel/kv_reshard.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/kv/kv_layout.h"
#include "common/model/generate/model_gen.h"
#include "common/model/generate/random_weights.h"
#include "common/model/tensor_parallel/tensor_parallel.h"
#include "common/model/tensor_parallel/tp_testing.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace trident::model {
namespace {

using ::trident::testing::IsOk;

using tp_testing::ConfigOf;
using tp_testing::RankSpec;

// The element of the prompt's KV at (layer, prompt block, K/V, global head,
// token slot, dim), as 16 bits that differ between any two of them here.
uint16_t Code(int32_t l, int32_t i, int32_t v, int32_t g, int32_t t, int32_t d) {
  return static_cast<uint16_t>((((l * 7 + i) * 2 + v) * 8 + g) * 1031 + t * 67 + d + 1);
}

// Every rank's pool on one side, filled with `fill`, the prompt's blocks
// written where `blocks` says (when `write`).
std::vector<std::vector<uint16_t>> Pools(const ModelConfig& config, int32_t size,
                                         const kv::KvCacheSpec& spec,
                                         const std::vector<int32_t>& blocks, bool write,
                                         uint16_t fill) {
  std::vector<std::vector<uint16_t>> pools;
  for (int32_t rank = 0; rank < size; ++rank) {
    std::vector<uint16_t> pool(spec.num_layers * spec.layer_stride_elements(), fill);
    auto layout = MakeTensorParallelLayout(config, size, rank);
    for (int32_t l = 0; write && l < spec.num_layers; ++l) {
      for (size_t i = 0; i < blocks.size(); ++i) {
        for (int32_t v = 0; v < 2; ++v) {
          const uint64_t base =
              (v ? spec.ValueOffsetBytes(l, blocks[i]) : spec.KeyOffsetBytes(l, blocks[i])) / 2;
          for (int32_t h = 0; h < layout->kv_heads; ++h) {
            for (int32_t t = 0; t < spec.block_size; ++t) {
              for (int32_t d = 0; d < spec.head_dim; ++d) {
                pool[base + (h * spec.block_size + t) * spec.head_dim + d] =
                    Code(l, static_cast<int32_t>(i), v, layout->first_kv_head + h, t, d);
              }
            }
          }
        }
      }
    }
    pools.push_back(std::move(pool));
  }
  return pools;
}

// Source pools with the prompt, the runs applied with memcpy, and the
// destination pools compared with pools holding the prompt where it should
// land: every byte, so a missing or stray write fails.
void CheckMove(const std::string& preset, int32_t src_size, int32_t dst_size) {
  SCOPED_TRACE(::testing::Message() << preset << " TP " << src_size << " -> " << dst_size);
  const ModelConfig& config = ConfigOf(preset);
  const std::vector<int32_t> src_blocks = {5, 0, 3};
  const std::vector<int32_t> dst_blocks = {1, 6, 2};
  KvReshardRequest request;
  request.src_size = src_size;
  request.dst_size = dst_size;
  request.src_spec = RankSpec(config, src_size, 6);
  request.dst_spec = RankSpec(config, dst_size, 7);
  request.src_blocks = src_blocks;
  request.dst_blocks = dst_blocks;
  request.num_layers = config.num_hidden_layers;
  auto runs = PlanKvReshard(config, request);
  ASSERT_THAT(runs.status(), IsOk());
  auto src = Pools(config, src_size, request.src_spec, src_blocks, true, 0xdead);
  auto dst = Pools(config, dst_size, request.dst_spec, dst_blocks, false, 0xbeef);
  for (const KvCopyRun& run : *runs) {
    ASSERT_EQ(run.src_offset % 2, 0u);
    ASSERT_LE(run.src_offset + run.bytes, src[run.src_rank].size() * 2);
    ASSERT_LE(run.dst_offset + run.bytes, dst[run.dst_rank].size() * 2);
    std::memcpy(reinterpret_cast<char*>(dst[run.dst_rank].data()) + run.dst_offset,
                reinterpret_cast<const char*>(src[run.src_rank].data()) + run.src_offset,
                run.bytes);
  }
  const auto want = Pools(config, dst_size, request.dst_spec, dst_blocks, true, 0xbeef);
  for (int32_t rank = 0; rank < dst_size; ++rank) {
    EXPECT_TRUE(dst[rank] == want[rank]) << "destination rank " << rank;
  }
  std::printf("%s TP %d -> %d: %zu runs\n", preset.c_str(), src_size, dst_size, runs->size());
}

TEST(KvReshardTest, MovesEveryHeadToEveryRankHoldingIt) {
  for (const char* preset : {"llama3-tiny", "mistral-tiny"}) {
    for (auto [from, to] : std::vector<std::pair<int32_t, int32_t>>{
             {1, 1}, {2, 1}, {1, 2}, {4, 1}, {1, 4}, {2, 4}, {4, 2}, {2, 2}}) {
      CheckMove(preset, from, to);
    }
  }
}

// The same degree on both sides moves each rank's heads as one run per
// (layer, block, K or V), rank to the same rank.
TEST(KvReshardTest, SameDegreeIsOneRunPerRankAndBlock) {
  const ModelConfig& config = ConfigOf("llama3-tiny");
  const std::vector<int32_t> blocks = {0, 1};
  KvReshardRequest request;
  request.src_size = request.dst_size = 2;
  request.src_spec = request.dst_spec = RankSpec(config, 2, 2);
  request.src_blocks = request.dst_blocks = blocks;
  request.first_layer = 1;
  request.num_layers = 1;
  auto runs = PlanKvReshard(config, request);
  ASSERT_THAT(runs.status(), IsOk());
  ASSERT_EQ(runs->size(), 2u * 2u * 2u);  // blocks x K/V x ranks
  for (const KvCopyRun& run : *runs) {
    EXPECT_EQ(run.src_rank, run.dst_rank);
    EXPECT_EQ(run.src_offset, run.dst_offset);
    EXPECT_EQ(run.bytes, request.src_spec.value_offset_bytes());
  }
}

TEST(KvReshardTest, RejectsMismatchedRequests) {
  const ModelConfig& config = ConfigOf("llama3-tiny");
  const std::vector<int32_t> two = {0, 1};
  const std::vector<int32_t> one = {0};
  const std::vector<int32_t> outside = {0, 9};
  KvReshardRequest good;
  good.src_size = 2;
  good.dst_size = 1;
  good.src_spec = RankSpec(config, 2, 4);
  good.dst_spec = RankSpec(config, 1, 4);
  good.src_blocks = two;
  good.dst_blocks = two;
  good.num_layers = config.num_hidden_layers;
  ASSERT_THAT(PlanKvReshard(config, good).status(), IsOk());
  auto code = [&](KvReshardRequest r) { return PlanKvReshard(config, r).status().code(); };
  KvReshardRequest r = good;
  r.src_spec = RankSpec(config, 1, 4);  // All heads, but a rank at TP 2 holds half.
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.dst_blocks = one;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.dst_blocks = outside;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.num_layers = config.num_hidden_layers + 1;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.dst_spec.block_size = 32;
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.src_size = 3;  // 4 query heads do not split in 3.
  EXPECT_EQ(code(r), absl::StatusCode::kInvalidArgument);
  r = good;
  r.src_spec.dtype = numeric::DType::kFP8E4M3;
  r.dst_spec.dtype = numeric::DType::kFP8E4M3;
  EXPECT_EQ(code(r), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace trident::model
