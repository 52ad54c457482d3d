#include "common/model/generate/random_weights.h"

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/model/checkpoint.h"
#include "common/model/generate/model_gen.h"
#include "common/model/llama_weights.h"
#include "common/model/tensor_parallel/tensor_parallel.h"
#include "common/numeric/counter_stream.h"
#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace trident::model::generate {
namespace {

using ::trident::testing::IsOk;

std::string TempDir(const std::string& leaf) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + leaf;
}

int64_t Elements(const TensorShard& shard) {
  int64_t n = 1;
  for (int64_t d : shard.shape) n *= d;
  return n;
}

// Every rank's shard of every tensor, at each TP degree the shape allows,
// read from the written checkpoint and from RandomWeights: the same bits.
void ExpectSameShards(const std::string& preset, absl::StatusOr<ModelSpec> spec) {
  ASSERT_THAT(spec.status(), IsOk());
  const std::string dir = TempDir(preset);
  ASSERT_THAT(WriteModel(*spec, dir), IsOk());
  auto checkpoint = Checkpoint::Open(dir);
  ASSERT_THAT(checkpoint.status(), IsOk());
  auto weights = RandomWeights::Create(*spec);
  ASSERT_THAT(weights.status(), IsOk());
  auto written_config = LoadModelConfig(dir);
  ASSERT_THAT(written_config.status(), IsOk());
  const ModelConfig& config = (*weights)->config();
  EXPECT_EQ(config.vocab_size, written_config->vocab_size);
  EXPECT_EQ(config.num_hidden_layers, written_config->num_hidden_layers);
  EXPECT_EQ(config.tie_word_embeddings, written_config->tie_word_embeddings);
  int compared = 0;
  for (int32_t size : {1, 2, 4}) {
    for (int32_t rank = 0; rank < size; ++rank) {
      auto layout = MakeTensorParallelLayout(config, size, rank);
      if (!layout.ok()) continue;  // The shape does not split this way.
      for (const ExpectedTensor& t : ExpectedLlamaTensors(config)) {
        auto shard = ShardOf(config, *layout, t.name);
        ASSERT_THAT(shard.status(), IsOk());
        std::vector<uint16_t> from_file(Elements(*shard)), generated(Elements(*shard), 0xffff);
        ASSERT_THAT(ReadShardBf16(**checkpoint, config, *layout, t.name, absl::MakeSpan(from_file)),
                    IsOk());
        ASSERT_THAT(ReadShardBf16(**weights, config, *layout, t.name, absl::MakeSpan(generated)),
                    IsOk());
        EXPECT_EQ(from_file, generated)
            << preset << " " << t.name << " rank " << rank << " of " << size;
        ++compared;
      }
    }
  }
  // Whole tensors, as a single-GPU loader reads them: info and f32 values.
  EXPECT_EQ((*weights)->total_bytes(), (*checkpoint)->total_bytes());
  for (const ExpectedTensor& t : ExpectedLlamaTensors(config)) {
    auto want = (*checkpoint)->Info(t.name);
    auto got = (*weights)->Info(t.name);
    ASSERT_THAT(got.status(), IsOk());
    EXPECT_EQ(got->shape, want->shape) << t.name;
    EXPECT_EQ(got->dtype, want->dtype) << t.name;
    EXPECT_EQ(got->num_bytes, want->num_bytes) << t.name;
    std::vector<float> a(want->numel), b(want->numel);
    ASSERT_THAT((*checkpoint)->ReadFloat(t.name, absl::MakeSpan(a)), IsOk());
    ASSERT_THAT((*weights)->ReadFloat(t.name, absl::MakeSpan(b)), IsOk());
    EXPECT_EQ(a, b) << t.name;
  }
  EXPECT_FALSE((*weights)->Has("lm_head.weight") && config.tie_word_embeddings);
  std::printf("%s: %d shards compared\n", preset.c_str(), compared);
  EXPECT_GT(compared, 0);
}

TEST(RandomWeightsTest, EqualsTheWrittenCheckpointShardByShard) {
  for (const char* preset : {"llama3-tiny", "qwen2-tiny", "mistral-tiny"}) {
    SCOPED_TRACE(preset);
    ExpectSameShards(preset, PresetSpec(preset));
  }
  // bf16 in shards of at most 1 MiB, as the large presets are written.
  absl::StatusOr<ModelSpec> bf16 = PresetSpec("llama3-tiny");
  ASSERT_THAT(bf16.status(), IsOk());
  bf16->dtype = numeric::DType::kBF16;
  bf16->max_shard_bytes = 1 << 20;
  ExpectSameShards("llama3-tiny-bf16", bf16);
}

// The 70B shape is never written: its config and a rank's block of a
// tensor, computed twice, the same.
TEST(RandomWeightsTest, GivesTheLargeShapesShardsWithoutWritingThem) {
  auto spec = PresetSpec("llama3-70b");
  ASSERT_THAT(spec.status(), IsOk());
  auto weights = RandomWeights::Create(*spec);
  ASSERT_THAT(weights.status(), IsOk());
  const ModelConfig& config = (*weights)->config();
  EXPECT_EQ(config.hidden_size, 8192);
  EXPECT_EQ(config.num_hidden_layers, 80);
  EXPECT_EQ(config.num_attention_heads, 64);
  EXPECT_EQ(config.num_key_value_heads, 8);
  EXPECT_EQ(config.intermediate_size, 28672);
  auto layout = MakeTensorParallelLayout(config, 4, 3);
  ASSERT_THAT(layout.status(), IsOk());
  const std::string name = "model.layers.79.self_attn.k_proj.weight";
  auto shard = ShardOf(config, *layout, name);
  ASSERT_THAT(shard.status(), IsOk());
  ASSERT_EQ(shard->shape, (std::vector<int64_t>{256, 8192}));  // 2 KV heads of 128
  std::vector<uint16_t> a(Elements(*shard)), b(Elements(*shard));
  ASSERT_THAT(ReadShardBf16(**weights, config, *layout, name, absl::MakeSpan(a)), IsOk());
  ASSERT_THAT(ReadShardBf16(**weights, config, *layout, name, absl::MakeSpan(b)), IsOk());
  EXPECT_EQ(a, b);
  // Read in blocks small enough to be computed on one thread: the same as
  // the large read split over threads.
  std::vector<uint16_t> pieces;
  for (int64_t row = 0; row < 256; row += 64) {
    std::vector<uint16_t> piece(64 * 8192);
    ASSERT_THAT((*weights)->ReadBf16Slice(name, {SliceAxis::kRows, 768 + row, 768 + row + 64},
                                          absl::MakeSpan(piece)),
                IsOk());
    pieces.insert(pieces.end(), piece.begin(), piece.end());
  }
  EXPECT_EQ(pieces, a);
  int distinct = 0;
  for (size_t i = 1; i < a.size(); ++i) distinct += a[i] != a[i - 1];
  EXPECT_GT(distinct, static_cast<int>(a.size() / 2));  // Random, not a fill.
}

// What a device computes from (kernels/cuda's random_fill evaluates each
// block element by element as numeric::BlockElement does): every rank's
// block of every tensor, evaluated from its description, equals the
// written checkpoint's shard; a stored checkpoint has no streams.
TEST(RandomWeightsTest, DescribesEachShardAsAStream) {
  auto spec = PresetSpec("llama3-tiny");
  ASSERT_THAT(spec.status(), IsOk());
  spec->dtype = numeric::DType::kBF16;
  const std::string dir = TempDir("llama3-tiny-streams");
  ASSERT_THAT(WriteModel(*spec, dir), IsOk());
  auto checkpoint = Checkpoint::Open(dir);
  ASSERT_THAT(checkpoint.status(), IsOk());
  auto weights = RandomWeights::Create(*spec);
  ASSERT_THAT(weights.status(), IsOk());
  const ModelConfig& config = (*weights)->config();
  int quartered = 0;
  for (int32_t rank = 0; rank < 2; ++rank) {
    auto layout = MakeTensorParallelLayout(config, 2, rank);
    ASSERT_THAT(layout.status(), IsOk());
    for (const ExpectedTensor& t : ExpectedLlamaTensors(config)) {
      auto shard = ShardOf(config, *layout, t.name);
      ASSERT_THAT(shard.status(), IsOk());
      const TensorSlice slice =
          shard->whole ? TensorSlice{SliceAxis::kRows, 0, shard->shape[0]} : shard->slice;
      auto block = (*weights)->StreamBlock(t.name, slice);
      ASSERT_THAT(block.status(), IsOk()) << t.name;
      ASSERT_EQ(block->rows * block->cols, Elements(*shard)) << t.name;
      std::vector<uint16_t> want(Elements(*shard));
      ASSERT_THAT(ReadShardBf16(**checkpoint, config, *layout, t.name, absl::MakeSpan(want)),
                  IsOk());
      for (int64_t r = 0; r < block->rows; ++r) {
        for (int64_t c = 0; c < block->cols; ++c) {
          ASSERT_EQ(numeric::FloatToBf16(numeric::BlockElement(*block, r, c)),
                    want[static_cast<size_t>(r * block->cols + c)])
              << t.name << " rank " << rank << " (" << r << ", " << c << ")";
        }
      }
      for (uint8_t q : block->quarter_rows) quartered += q;
    }
  }
  EXPECT_GT(quartered, 0);  // The vocabulary's partial characters are scaled.
  EXPECT_EQ(
      (*checkpoint)->StreamBlock("model.norm.weight", {SliceAxis::kRows, 0, 1}).status().code(),
      absl::StatusCode::kUnimplemented);
  EXPECT_EQ((*weights)->StreamBlock("model.nope", {SliceAxis::kRows, 0, 1}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(RandomWeightsTest, RejectsWhatACheckpointRejects) {
  auto spec = PresetSpec("llama3-tiny");
  ASSERT_THAT(spec.status(), IsOk());
  auto weights = RandomWeights::Create(*spec);
  ASSERT_THAT(weights.status(), IsOk());
  std::vector<uint16_t> out(4);
  EXPECT_EQ((*weights)->ReadBf16("model.nope", absl::MakeSpan(out)).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ((*weights)->ReadBf16("model.norm.weight", absl::MakeSpan(out)).code(),
            absl::StatusCode::kInvalidArgument);  // Wrong size.
  EXPECT_EQ(
      (*weights)
          ->ReadBf16Slice("model.norm.weight", {SliceAxis::kColumns, 0, 4}, absl::MakeSpan(out))
          .code(),
      absl::StatusCode::kInvalidArgument);  // Columns of a 1-D tensor.
  EXPECT_EQ((*weights)
                ->ReadBf16Slice("model.norm.weight", {SliceAxis::kRows, 4, 4}, absl::MakeSpan(out))
                .code(),
            absl::StatusCode::kInvalidArgument);  // Empty.
  ModelSpec bad = *spec;
  bad.num_kv_heads = 3;
  EXPECT_EQ(RandomWeights::Create(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trident::model::generate
