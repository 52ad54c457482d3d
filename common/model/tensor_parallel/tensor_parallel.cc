#include "common/model/tensor_parallel/tensor_parallel.h"

#include <algorithm>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/model/llama_weights.h"

namespace trident::model {
namespace {

absl::Status Invalid(const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("tensor parallelism: ", message));
}

TensorShard Whole(std::vector<int64_t> shape) {
  TensorShard shard;
  shard.shape = std::move(shape);
  return shard;
}

// Rows [first, first + count) of a tensor of `full` shape (1-D or 2-D), or
// columns of a 2-D one.
TensorShard Part(const std::vector<int64_t>& full, SliceAxis axis, int64_t first, int64_t count) {
  TensorShard shard;
  shard.whole = false;
  shard.slice = TensorSlice{axis, first, first + count};
  shard.shape = full;
  shard.shape[axis == SliceAxis::kRows ? 0 : 1] = count;
  return shard;
}

// The shard of a per-layer tensor by its suffix; nullopt for an unknown one.
absl::optional<TensorShard> LayerShard(const ModelConfig& config,
                                       const TensorParallelLayout& layout,
                                       absl::string_view suffix) {
  const std::vector<int64_t> full = LayerTensorShape(config, suffix);
  if (full.empty()) return absl::nullopt;
  const int64_t head_dim = config.head_dim;
  const int64_t q_first = layout.first_q_head * head_dim;
  const int64_t q_count = layout.q_heads * head_dim;
  const int64_t kv_first = layout.first_kv_head * head_dim;
  const int64_t kv_count = layout.kv_heads * head_dim;
  if (suffix == kQProj || suffix == kQProjBias)
    return Part(full, SliceAxis::kRows, q_first, q_count);
  if (suffix == kKProj || suffix == kKProjBias || suffix == kVProj || suffix == kVProjBias) {
    return Part(full, SliceAxis::kRows, kv_first, kv_count);
  }
  if (suffix == kOProj) return Part(full, SliceAxis::kColumns, q_first, q_count);
  if (suffix == kGateProj || suffix == kGateProjBias || suffix == kUpProj ||
      suffix == kUpProjBias) {
    return Part(full, SliceAxis::kRows, layout.first_intermediate, layout.intermediate);
  }
  if (suffix == kDownProj)
    return Part(full, SliceAxis::kColumns, layout.first_intermediate, layout.intermediate);
  // Norms, and the biases added once after a row-parallel sum.
  return Whole(full);
}

}  // namespace

absl::StatusOr<TensorParallelLayout> MakeTensorParallelLayout(const ModelConfig& config,
                                                              int32_t size, int32_t rank) {
  if (size < 1 || rank < 0 || rank >= size) {
    return Invalid(absl::StrCat("rank ", rank, " of ", size, " ranks; want 0 <= rank < size"));
  }
  const int32_t heads = config.num_attention_heads;
  const int32_t kv = config.num_key_value_heads;
  if (heads % size != 0) {
    return Invalid(absl::StrCat(heads, " attention heads do not split over ", size, " ranks"));
  }
  if (kv <= 0 || (kv % size != 0 && size % kv != 0)) {
    return Invalid(
        absl::StrCat(kv, " key-value heads neither split over ", size, " ranks nor divide them"));
  }
  if (config.intermediate_size % size != 0) {
    return Invalid(absl::StrCat("intermediate size ", config.intermediate_size,
                                " does not split over ", size, " ranks"));
  }
  TensorParallelLayout layout;
  layout.size = size;
  layout.rank = rank;
  layout.q_heads = heads / size;
  layout.first_q_head = rank * layout.q_heads;
  if (kv % size == 0) {
    layout.kv_heads = kv / size;
    layout.first_kv_head = rank * layout.kv_heads;
  } else {
    layout.kv_heads = 1;
    layout.first_kv_head = rank / (size / kv);
    layout.kv_replicated = true;
  }
  layout.intermediate = config.intermediate_size / size;
  layout.first_intermediate = int64_t{rank} * layout.intermediate;
  // Blocks of whole 64-token groups: each rank's columns of the gathered
  // f32 logits start 256-byte aligned, as GEMM epilogues want them.
  const int64_t per_rank = ((int64_t{config.vocab_size} + size - 1) / size + kVocabBlockAlign - 1) /
                           kVocabBlockAlign * kVocabBlockAlign;
  layout.first_vocab = std::min<int64_t>(config.vocab_size, rank * per_rank);
  layout.vocab =
      std::min<int64_t>(config.vocab_size, layout.first_vocab + per_rank) - layout.first_vocab;
  return layout;
}

absl::StatusOr<TensorShard> ShardOf(const ModelConfig& config, const TensorParallelLayout& layout,
                                    absl::string_view name) {
  const int64_t hidden = config.hidden_size;
  absl::optional<TensorShard> shard;
  absl::string_view rest = name;
  if (name == kEmbedTokensName || (name == kLmHeadName && !config.tie_word_embeddings)) {
    shard = Part({config.vocab_size, hidden}, SliceAxis::kRows, layout.first_vocab, layout.vocab);
  } else if (name == kFinalNormName) {
    shard = Whole({hidden});
  } else if (absl::ConsumePrefix(&rest, "model.layers.")) {
    const size_t dot = rest.find('.');
    int32_t layer = -1;
    if (dot != absl::string_view::npos && absl::SimpleAtoi(rest.substr(0, dot), &layer) &&
        layer >= 0 && layer < config.num_hidden_layers) {
      shard = LayerShard(config, layout, rest.substr(dot + 1));
    }
  }
  if (!shard.has_value()) {
    return Invalid(absl::StrCat("\"", name, "\" is not a tensor of this model"));
  }
  if (layout.size == 1 && !shard->whole) *shard = Whole(shard->shape);
  return *std::move(shard);
}

ModelConfig RankModelConfig(const ModelConfig& config, const TensorParallelLayout& layout) {
  ModelConfig rank = config;
  rank.num_attention_heads = layout.q_heads;
  rank.num_key_value_heads = layout.kv_heads;
  rank.head_dim = config.head_dim;  // Explicit: hidden / heads no longer gives it.
  rank.intermediate_size = static_cast<int32_t>(layout.intermediate);
  return rank;
}

absl::Status ReadShardBf16(const TensorReader& checkpoint, const ModelConfig& config,
                           const TensorParallelLayout& layout, absl::string_view name,
                           absl::Span<uint16_t> out) {
  absl::StatusOr<TensorShard> shard = ShardOf(config, layout, name);
  if (!shard.ok()) return shard.status();
  if (shard->whole) return checkpoint.ReadBf16(name, out);
  if (shard->slice.begin == shard->slice.end) {  // The last rank's empty vocabulary block.
    return out.empty() ? absl::OkStatus()
                       : Invalid(absl::StrCat("rank ", layout.rank, " holds none of \"", name,
                                              "\"; the output holds ", out.size()));
  }
  return checkpoint.ReadBf16Slice(name, shard->slice, out);
}

absl::StatusOr<std::vector<KvHeadRoute>> KvReshardRoutes(const ModelConfig& config,
                                                         int32_t src_size, int32_t dst_size) {
  if (src_size < 1 || dst_size < 1) {
    return Invalid(absl::StrCat("KV moves from ", src_size, " to ", dst_size,
                                " ranks; want at least one each"));
  }
  std::vector<KvHeadRoute> routes(static_cast<size_t>(std::max(config.num_key_value_heads, 0)));
  for (size_t h = 0; h < routes.size(); ++h) {
    routes[h].kv_head = static_cast<int32_t>(h);
    routes[h].src_rank = -1;
  }
  for (int32_t rank = src_size - 1; rank >= 0; --rank) {  // The lowest holder wins.
    absl::StatusOr<TensorParallelLayout> layout = MakeTensorParallelLayout(config, src_size, rank);
    if (!layout.ok()) return layout.status();
    for (int32_t h = layout->first_kv_head; h < layout->first_kv_head + layout->kv_heads; ++h) {
      routes[static_cast<size_t>(h)].src_rank = rank;
    }
  }
  for (int32_t rank = 0; rank < dst_size; ++rank) {
    absl::StatusOr<TensorParallelLayout> layout = MakeTensorParallelLayout(config, dst_size, rank);
    if (!layout.ok()) return layout.status();
    for (int32_t h = layout->first_kv_head; h < layout->first_kv_head + layout->kv_heads; ++h) {
      routes[static_cast<size_t>(h)].dst_ranks.push_back(rank);
    }
  }
  return routes;
}

}  // namespace trident::model
