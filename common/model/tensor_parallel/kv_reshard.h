// Moving a prompt's KV cache between workers of different tensor-parallel
// degrees, as byte runs: a prefill worker at TP = src_size pushes to a
// decode worker at TP = dst_size (2 -> 1, 1 -> 2, 4 -> 2, ...). Each rank
// holds its own pool in common/kv's layout with its own KV heads (a
// TensorParallelLayout's), and the ranks of one worker use the same block
// ids. Every KV head goes from one source rank that holds it to every
// destination rank that holds it (KvReshardRoutes), K and V of each layer
// and block; heads adjacent on both sides travel as one run. The runs are
// what a transport moves: UCX puts, or block_copy over a GPU-to-GPU lane.

#ifndef TRIDENT_COMMON_MODEL_TENSOR_PARALLEL_KV_RESHARD_H_
#define TRIDENT_COMMON_MODEL_TENSOR_PARALLEL_KV_RESHARD_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/kv/kv_layout.h"
#include "common/model/config.h"

namespace trident::model {

// `bytes` from source rank src_rank's pool at src_offset to destination rank
// dst_rank's pool at dst_offset (offsets from each pool's base).
struct KvCopyRun {
  int32_t src_rank = 0;
  int32_t dst_rank = 0;
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;

  friend bool operator==(const KvCopyRun&, const KvCopyRun&) = default;
};

struct KvReshardRequest {
  int32_t src_size = 1;
  int32_t dst_size = 1;
  // A rank's spec on each side: num_kv_heads its layout's kv_heads, the
  // other fields the model's (bf16; FP8 caches are not re-sharded).
  kv::KvCacheSpec src_spec;
  kv::KvCacheSpec dst_spec;
  // Block i of the prompt is src_blocks[i] on every source rank and
  // dst_blocks[i] on every destination rank.
  absl::Span<const int32_t> src_blocks;
  absl::Span<const int32_t> dst_blocks;
  // Layers [first_layer, first_layer + num_layers): a push goes layer by
  // layer.
  int32_t first_layer = 0;
  int32_t num_layers = 0;
};

// The runs, ordered by layer, block, K before V, destination rank, then
// source rank. Errors
// (kInvalidArgument naming the field): TP sizes the model does not split
// into, a spec whose heads, head_dim, layers or block size disagree with the
// model and its rank's layout, an invalid spec, blocks lists of different
// lengths or ids outside a pool, layers outside the model;
// kFailedPrecondition for an FP8 cache.
absl::StatusOr<std::vector<KvCopyRun>> PlanKvReshard(const ModelConfig& config,
                                                     const KvReshardRequest& request);

}  // namespace trident::model

#endif  // TRIDENT_COMMON_MODEL_TENSOR_PARALLEL_KV_RESHARD_H_
