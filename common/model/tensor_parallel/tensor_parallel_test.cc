#include "common/model/tensor_parallel/tensor_parallel.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/checkpoint.h"
#include "common/model/config.h"
#include "common/model/generate/model_gen.h"
#include "common/model/llama_weights.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::model {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

ModelConfig Config(int32_t heads, int32_t kv_heads, int32_t intermediate, int32_t vocab) {
  ModelConfig config;
  config.hidden_size = 64;
  config.num_hidden_layers = 2;
  config.num_attention_heads = heads;
  config.num_key_value_heads = kv_heads;
  config.head_dim = 16;
  config.intermediate_size = intermediate;
  config.vocab_size = vocab;
  return config;
}

TEST(TensorParallelLayoutTest, SplitsHeadsIntermediateAndVocabulary) {
  const ModelConfig config = Config(32, 8, 14336, 128256);  // Llama-3-8B's counts.
  for (int32_t rank = 0; rank < 4; ++rank) {
    absl::StatusOr<TensorParallelLayout> layout = MakeTensorParallelLayout(config, 4, rank);
    ASSERT_THAT(layout, IsOk());
    EXPECT_EQ(layout->q_heads, 8);
    EXPECT_EQ(layout->first_q_head, 8 * rank);
    EXPECT_EQ(layout->kv_heads, 2);
    EXPECT_EQ(layout->first_kv_head, 2 * rank);
    EXPECT_FALSE(layout->kv_replicated);
    EXPECT_EQ(layout->intermediate, 3584);
    EXPECT_EQ(layout->first_intermediate, 3584 * rank);
    EXPECT_EQ(layout->vocab, 32064);
    EXPECT_EQ(layout->first_vocab, 32064 * rank);
  }
}

TEST(TensorParallelLayoutTest, ReplicatesKvHeadsWhenFewerThanRanks) {
  // 8 query heads over 2 KV heads on 4 ranks: ranks 0-1 read KV head 0,
  // ranks 2-3 KV head 1; every query head of a rank reads the rank's KV head.
  const ModelConfig config = Config(8, 2, 64, 100);
  for (int32_t rank = 0; rank < 4; ++rank) {
    absl::StatusOr<TensorParallelLayout> layout = MakeTensorParallelLayout(config, 4, rank);
    ASSERT_THAT(layout, IsOk());
    EXPECT_TRUE(layout->kv_replicated);
    EXPECT_EQ(layout->kv_heads, 1);
    EXPECT_EQ(layout->first_kv_head, rank / 2);
    const int32_t group = config.num_attention_heads / config.num_key_value_heads;
    for (int32_t h = layout->first_q_head; h < layout->first_q_head + layout->q_heads; ++h) {
      EXPECT_GE(h / group, layout->first_kv_head);
      EXPECT_LT(h / group, layout->first_kv_head + layout->kv_heads);
    }
  }
}

// A rank runs the model with its own head counts: its kernels map local
// query head j to local KV head j / (q_heads / kv_heads), which must be the
// KV head the global mapping gives, whether KV heads are split or
// replicated.
TEST(TensorParallelLayoutTest, RankConfigKeepsEveryQueryHeadOnItsKvHead) {
  const int32_t shapes[][2] = {{32, 8}, {64, 8}, {8, 2}, {4, 1}, {4, 4}};
  for (const auto& shape : shapes) {
    const ModelConfig config = Config(shape[0], shape[1], 64, 100);
    const int32_t group = config.num_attention_heads / config.num_key_value_heads;
    for (int32_t size : {1, 2, 4, 8}) {
      for (int32_t rank = 0; rank < size; ++rank) {
        absl::StatusOr<TensorParallelLayout> layout = MakeTensorParallelLayout(config, size, rank);
        if (!layout.ok()) continue;  // Does not split this way.
        const ModelConfig local = RankModelConfig(config, *layout);
        SCOPED_TRACE(::testing::Message()
                     << shape[0] << "/" << shape[1] << " heads, rank " << rank << " of " << size);
        EXPECT_EQ(local.num_attention_heads, layout->q_heads);
        EXPECT_EQ(local.num_key_value_heads, layout->kv_heads);
        EXPECT_EQ(local.intermediate_size, layout->intermediate);
        EXPECT_EQ(local.head_dim, config.head_dim);
        EXPECT_EQ(local.hidden_size, config.hidden_size);
        EXPECT_EQ(local.vocab_size, config.vocab_size);
        ASSERT_EQ(local.num_attention_heads % local.num_key_value_heads, 0);
        const int32_t local_group = local.num_attention_heads / local.num_key_value_heads;
        for (int32_t j = 0; j < local.num_attention_heads; ++j) {
          EXPECT_EQ(layout->first_kv_head + j / local_group, (layout->first_q_head + j) / group)
              << "local query head " << j;
        }
      }
    }
  }
}

TEST(TensorParallelLayoutTest, UnevenVocabularyLeavesTheLastBlockShort) {
  const ModelConfig config = Config(4, 4, 64, 300);
  std::vector<int64_t> first, count;
  for (int32_t rank = 0; rank < 4; ++rank) {
    absl::StatusOr<TensorParallelLayout> layout = MakeTensorParallelLayout(config, 4, rank);
    ASSERT_THAT(layout, IsOk());
    first.push_back(layout->first_vocab);
    count.push_back(layout->vocab);
  }
  // ceil(300 / 4) = 75, rounded up to whole 64-token groups: 128.
  EXPECT_THAT(first, ElementsAre(0, 128, 256, 300));
  EXPECT_THAT(count, ElementsAre(128, 128, 44, 0));
}

TEST(TensorParallelLayoutTest, RefusesShapesThatDoNotSplit) {
  EXPECT_THAT(MakeTensorParallelLayout(Config(4, 2, 64, 10), 0, 0),
              StatusIs(kInvalid, HasSubstr("rank 0 of 0")));
  EXPECT_THAT(MakeTensorParallelLayout(Config(4, 2, 64, 10), 2, 2), StatusIs(kInvalid));
  EXPECT_THAT(MakeTensorParallelLayout(Config(4, 2, 64, 10), 3, 0),
              StatusIs(kInvalid, HasSubstr("4 attention heads do not split over 3 ranks")));
  EXPECT_THAT(MakeTensorParallelLayout(Config(12, 3, 64, 10), 2, 0),
              StatusIs(kInvalid, HasSubstr("3 key-value heads")));
  EXPECT_THAT(MakeTensorParallelLayout(Config(4, 2, 66, 10), 4, 0),
              StatusIs(kInvalid, HasSubstr("intermediate size 66")));
}

TEST(KvReshardTest, RoutesEachKvHeadFromOneHolderToEveryHolder) {
  // 8 KV heads: TP 2 (4 heads a rank) to TP 4 (2 a rank).
  absl::StatusOr<std::vector<KvHeadRoute>> routes = KvReshardRoutes(Config(32, 8, 64, 10), 2, 4);
  ASSERT_THAT(routes, IsOk());
  ASSERT_EQ(routes->size(), 8u);
  for (int32_t h = 0; h < 8; ++h) {
    EXPECT_EQ((*routes)[h].kv_head, h);
    EXPECT_EQ((*routes)[h].src_rank, h / 4);
    EXPECT_THAT((*routes)[h].dst_ranks, ElementsAre(h / 2));
  }
  // 2 KV heads, TP 4 (replicated: ranks 0-1 hold head 0, 2-3 head 1) to
  // TP 1 and back.
  routes = KvReshardRoutes(Config(8, 2, 64, 10), 4, 1);
  ASSERT_THAT(routes, IsOk());
  EXPECT_EQ((*routes)[0].src_rank, 0);
  EXPECT_EQ((*routes)[1].src_rank, 2);
  EXPECT_THAT((*routes)[1].dst_ranks, ElementsAre(0));
  routes = KvReshardRoutes(Config(8, 2, 64, 10), 1, 4);
  ASSERT_THAT(routes, IsOk());
  EXPECT_EQ((*routes)[1].src_rank, 0);
  EXPECT_THAT((*routes)[0].dst_ranks, ElementsAre(0, 1));
  EXPECT_THAT((*routes)[1].dst_ranks, ElementsAre(2, 3));
  EXPECT_THAT(KvReshardRoutes(Config(8, 2, 64, 10), 3, 1),
              StatusIs(kInvalid, HasSubstr("8 attention heads do not split over 3 ranks")));
  EXPECT_THAT(KvReshardRoutes(Config(8, 2, 64, 10), 1, 0), StatusIs(kInvalid));
}

TEST(TensorParallelShardTest, NamesOutsideTheModelAreRefused) {
  const ModelConfig config = Config(4, 2, 64, 10);
  absl::StatusOr<TensorParallelLayout> layout = MakeTensorParallelLayout(config, 2, 0);
  ASSERT_THAT(layout, IsOk());
  for (const char* name : {"model.layers.2.self_attn.q_proj.weight", "model.layers.x.mlp",
                           "model.layers.0.self_attn.rotary_emb.inv_freq", "other"}) {
    EXPECT_THAT(ShardOf(config, *layout, name),
                StatusIs(kInvalid, AllOf(HasSubstr(name), HasSubstr("not a tensor"))));
  }
}

// Every rank's shard of every tensor of a generated model, read from the
// checkpoint, is the matching block of the whole tensor, and the ranks'
// blocks together are the tensor.
class TensorParallelCheckpointTest
    : public ::testing::TestWithParam<std::tuple<std::string, int32_t>> {};

TEST_P(TensorParallelCheckpointTest, ShardsReassembleEveryTensor) {
  const auto& [preset, size] = GetParam();
  absl::StatusOr<generate::ModelSpec> spec = generate::PresetSpec(preset);
  ASSERT_THAT(spec, IsOk());
  const std::string dir = ::trident::testing::TestTmpPath(absl::StrCat(preset, "-tp", size));
  ASSERT_THAT(generate::WriteModel(*spec, dir), IsOk());
  absl::StatusOr<ModelConfig> config = LoadModelConfig(dir);
  ASSERT_THAT(config, IsOk());
  absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::Open(dir);
  ASSERT_THAT(checkpoint, IsOk());
  const int32_t group = config->num_attention_heads / config->num_key_value_heads;
  for (const ExpectedTensor& tensor : ExpectedLlamaTensors(*config)) {
    SCOPED_TRACE(tensor.name);
    int64_t numel = 1;
    for (int64_t d : tensor.shape) numel *= d;
    std::vector<uint16_t> whole(static_cast<size_t>(numel));
    ASSERT_THAT((*checkpoint)->ReadBf16(tensor.name, absl::MakeSpan(whole)), IsOk());
    const int64_t row_length = tensor.shape.size() == 2 ? tensor.shape[1] : 1;
    std::vector<int> covered(whole.size(), 0);
    int holders = 1;  // Ranks holding each element.
    for (int32_t rank = 0; rank < size; ++rank) {
      absl::StatusOr<TensorParallelLayout> layout = MakeTensorParallelLayout(*config, size, rank);
      ASSERT_THAT(layout, IsOk());
      absl::StatusOr<TensorShard> shard = ShardOf(*config, *layout, tensor.name);
      ASSERT_THAT(shard, IsOk());
      if (shard->whole) {
        holders = size;
      } else if (layout->kv_replicated && (tensor.name.find("k_proj") != std::string::npos ||
                                           tensor.name.find("v_proj") != std::string::npos)) {
        holders = size / config->num_key_value_heads;
      }
      int64_t shard_numel = 1;
      for (int64_t d : shard->shape) shard_numel *= d;
      std::vector<uint16_t> got(static_cast<size_t>(shard_numel));
      ASSERT_THAT(ReadShardBf16(**checkpoint, *config, *layout, tensor.name, absl::MakeSpan(got)),
                  IsOk());
      const int64_t rows = shard->shape[0];
      const int64_t cols = shard->shape.size() == 2 ? shard->shape[1] : 1;
      const bool columns = !shard->whole && shard->slice.axis == SliceAxis::kColumns;
      const int64_t first = shard->whole ? 0 : shard->slice.begin;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t at = columns ? r * row_length + first + c : (first + r) * row_length + c;
          ASSERT_EQ(got[static_cast<size_t>(r * cols + c)], whole[static_cast<size_t>(at)])
              << "rank " << rank << " element (" << r << ", " << c << ")";
          ++covered[static_cast<size_t>(at)];
        }
      }
      // A rank's query heads read KV heads it holds.
      EXPECT_GE(layout->first_q_head / group, layout->first_kv_head);
      EXPECT_LT((layout->first_q_head + layout->q_heads - 1) / group,
                layout->first_kv_head + layout->kv_heads);
    }
    // Each element is held by one rank, by every rank (replicated), or by
    // the ranks sharing a replicated KV head.
    for (size_t i = 0; i < covered.size(); ++i) {
      ASSERT_EQ(covered[i], holders) << "element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Presets, TensorParallelCheckpointTest,
    ::testing::Combine(::testing::Values("llama3-tiny", "mistral-tiny"),
                       ::testing::Values(1, 2, 4)),
    [](const ::testing::TestParamInfo<std::tuple<std::string, int32_t>>& info) {
      std::string name = std::get<0>(info.param);
      for (char& c : name) {
        if (c == '-') c = '_';
      }
      return absl::StrCat(name, "_tp", std::get<1>(info.param));
    });

}  // namespace
}  // namespace trident::model
