#include "common/model/tensor_parallel/kv_reshard.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/model/tensor_parallel/tensor_parallel.h"

namespace trident::model {
namespace {

absl::Status Invalid(const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("KV re-shard: ", message));
}

// The spec of one side against the model and that side's layout.
absl::Status CheckSpec(const ModelConfig& config, const kv::KvCacheSpec& spec,
                       const TensorParallelLayout& layout, const char* side) {
  if (absl::Status status = kv::Validate(spec); !status.ok()) {
    return Invalid(absl::StrCat(side, "_spec: ", status.message()));
  }
  if (spec.fp8()) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV re-shard: ", side, "_spec is FP8; only bf16 caches are re-sharded"));
  }
  if (spec.num_kv_heads != layout.kv_heads || spec.head_dim != config.head_dim ||
      spec.num_layers != config.num_hidden_layers) {
    return Invalid(absl::StrCat(side, "_spec has ", spec.num_kv_heads, " KV heads of ",
                                spec.head_dim, " over ", spec.num_layers, " layers; a rank at TP ",
                                layout.size, " holds ", layout.kv_heads, " of ", config.head_dim,
                                " over ", config.num_hidden_layers));
  }
  return absl::OkStatus();
}

absl::Status CheckBlocks(absl::Span<const int32_t> blocks, int32_t num_blocks, const char* side) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] < 0 || blocks[i] >= num_blocks) {
      return Invalid(absl::StrCat(side, "_blocks[", i, "] is ", blocks[i], "; the pool has ",
                                  num_blocks, " blocks"));
    }
  }
  return absl::OkStatus();
}

// Per destination rank, per source rank: the (source local head,
// destination local head) pairs of the heads that travel between them, in
// head order.
struct HeadPair {
  int32_t src = 0;
  int32_t dst = 0;
};

absl::StatusOr<std::vector<std::vector<std::vector<HeadPair>>>> HeadPairs(const ModelConfig& config,
                                                                          int32_t src_size,
                                                                          int32_t dst_size) {
  absl::StatusOr<std::vector<KvHeadRoute>> routes = KvReshardRoutes(config, src_size, dst_size);
  if (!routes.ok()) return routes.status();
  std::vector<std::vector<std::vector<HeadPair>>> pairs(
      dst_size, std::vector<std::vector<HeadPair>>(src_size));
  for (const KvHeadRoute& route : *routes) {
    absl::StatusOr<TensorParallelLayout> src =
        MakeTensorParallelLayout(config, src_size, route.src_rank);
    if (!src.ok()) return src.status();
    for (int32_t dst_rank : route.dst_ranks) {
      absl::StatusOr<TensorParallelLayout> dst =
          MakeTensorParallelLayout(config, dst_size, dst_rank);
      if (!dst.ok()) return dst.status();
      pairs[dst_rank][route.src_rank].push_back(
          {route.kv_head - src->first_kv_head, route.kv_head - dst->first_kv_head});
    }
  }
  return pairs;
}

}  // namespace

absl::StatusOr<std::vector<KvCopyRun>> PlanKvReshard(const ModelConfig& config,
                                                     const KvReshardRequest& r) {
  absl::StatusOr<TensorParallelLayout> src = MakeTensorParallelLayout(config, r.src_size, 0);
  if (!src.ok()) return src.status();
  absl::StatusOr<TensorParallelLayout> dst = MakeTensorParallelLayout(config, r.dst_size, 0);
  if (!dst.ok()) return dst.status();
  if (absl::Status s = CheckSpec(config, r.src_spec, *src, "src"); !s.ok()) return s;
  if (absl::Status s = CheckSpec(config, r.dst_spec, *dst, "dst"); !s.ok()) return s;
  if (r.src_spec.block_size != r.dst_spec.block_size) {
    return Invalid(absl::StrCat("block sizes differ: ", r.src_spec.block_size, " and ",
                                r.dst_spec.block_size));
  }
  if (r.src_blocks.size() != r.dst_blocks.size()) {
    return Invalid(absl::StrCat(r.src_blocks.size(), " source blocks for ", r.dst_blocks.size(),
                                " destination blocks"));
  }
  if (absl::Status s = CheckBlocks(r.src_blocks, r.src_spec.num_blocks, "src"); !s.ok()) return s;
  if (absl::Status s = CheckBlocks(r.dst_blocks, r.dst_spec.num_blocks, "dst"); !s.ok()) return s;
  if (r.first_layer < 0 || r.num_layers < 0 ||
      r.first_layer + r.num_layers > config.num_hidden_layers) {
    return Invalid(absl::StrCat("layers [", r.first_layer, ", ", r.first_layer + r.num_layers,
                                ") are not within the model's ", config.num_hidden_layers));
  }
  absl::StatusOr<std::vector<std::vector<std::vector<HeadPair>>>> pairs =
      HeadPairs(config, r.src_size, r.dst_size);
  if (!pairs.ok()) return pairs.status();
  // Bytes of one head's tokens in one block (K or V).
  const uint64_t head_bytes = static_cast<uint64_t>(r.src_spec.block_size) * config.head_dim *
                              r.src_spec.element_size_bytes();
  std::vector<KvCopyRun> runs;
  for (int32_t l = r.first_layer; l < r.first_layer + r.num_layers; ++l) {
    for (size_t i = 0; i < r.src_blocks.size(); ++i) {
      for (const bool value : {false, true}) {
        const uint64_t src_base = value ? r.src_spec.ValueOffsetBytes(l, r.src_blocks[i])
                                        : r.src_spec.KeyOffsetBytes(l, r.src_blocks[i]);
        const uint64_t dst_base = value ? r.dst_spec.ValueOffsetBytes(l, r.dst_blocks[i])
                                        : r.dst_spec.KeyOffsetBytes(l, r.dst_blocks[i]);
        for (int32_t d = 0; d < r.dst_size; ++d) {
          for (int32_t s = 0; s < r.src_size; ++s) {
            const std::vector<HeadPair>& heads = (*pairs)[d][s];
            for (size_t h = 0; h < heads.size();) {
              // Heads adjacent on both sides go as one run.
              size_t end = h + 1;
              while (end < heads.size() && heads[end].src == heads[end - 1].src + 1 &&
                     heads[end].dst == heads[end - 1].dst + 1) {
                ++end;
              }
              runs.push_back({s, d, src_base + heads[h].src * head_bytes,
                              dst_base + heads[h].dst * head_bytes, (end - h) * head_bytes});
              h = end;
            }
          }
        }
      }
    }
  }
  return runs;
}

}  // namespace trident::model
