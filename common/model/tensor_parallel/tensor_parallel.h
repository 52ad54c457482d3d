// Tensor parallelism over N ranks (GPUs) for a Llama-architecture model
// (Megatron-style): which part of each weight a rank holds, and what its
// attention and MLP compute.
//
//   q/k/v_proj, gate/up_proj   column-parallel: the rank's rows of W
//                              (its heads, its slice of the intermediate);
//   o_proj, down_proj          row-parallel: the rank's columns of W; the
//                              ranks' partial outputs are summed (all-reduce)
//                              and the bias, held by every rank, is added
//                              once, after the sum;
//   embed_tokens, lm_head      vocabulary-parallel: the rank's rows (a
//                              contiguous block of token ids); the embedding
//                              is summed over ranks, the logits gathered;
//   norms                      replicated.
//
// Query heads are split evenly. KV heads are split evenly when there are at
// least N of them, and otherwise replicated: each rank holds the one KV head
// its query heads read (N a multiple of the KV head count). A rank's weights
// are read straight from the checkpoint (Checkpoint::ReadBf16Slice), never
// the whole tensor. TP = 1 is every tensor whole.

#ifndef TRIDENT_COMMON_MODEL_TENSOR_PARALLEL_TENSOR_PARALLEL_H_
#define TRIDENT_COMMON_MODEL_TENSOR_PARALLEL_TENSOR_PARALLEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/checkpoint.h"
#include "common/model/config.h"

namespace trident::model {

inline constexpr int64_t kVocabBlockAlign = 64;

// What rank `rank` of `size` computes: ranges are [first, first + count).
struct TensorParallelLayout {
  int32_t size = 1;
  int32_t rank = 0;
  int32_t first_q_head = 0;
  int32_t q_heads = 0;
  int32_t first_kv_head = 0;
  int32_t kv_heads = 0;
  // Whether other ranks hold the same KV heads (fewer KV heads than ranks).
  bool kv_replicated = false;
  int64_t first_intermediate = 0;
  int64_t intermediate = 0;
  // Token ids [first_vocab, first_vocab + vocab): ceil(vocab_size / size)
  // rounded up to a multiple of kVocabBlockAlign per rank, the last ranks'
  // blocks shorter (or empty).
  int64_t first_vocab = 0;
  int64_t vocab = 0;
};

// kInvalidArgument naming the numbers when `size` < 1, `rank` is outside
// [0, size), the query heads or the intermediate size do not divide by
// `size`, or the KV heads neither divide by `size` nor divide it.
absl::StatusOr<TensorParallelLayout> MakeTensorParallelLayout(const ModelConfig& config,
                                                              int32_t size, int32_t rank);

// The model as rank `layout.rank` computes it: its query heads, its KV
// heads and its intermediate block; head_dim, the hidden size, the layers
// and the vocabulary unchanged (a rank's LM head covers layout.vocab rows
// of it). A rank's engine sizes its projections, attention kernels and KV
// pool from this config.
ModelConfig RankModelConfig(const ModelConfig& config, const TensorParallelLayout& layout);

// How a rank holds one tensor.
struct TensorShard {
  bool whole = true;           // Replicated (every rank holds all of it).
  TensorSlice slice;           // Unless whole.
  std::vector<int64_t> shape;  // Of what the rank holds.
};

// The shard of `name` (a tensor of ExpectedLlamaTensors(config)) rank
// `layout.rank` holds. kInvalidArgument for a name that is not one.
absl::StatusOr<TensorShard> ShardOf(const ModelConfig& config, const TensorParallelLayout& layout,
                                    absl::string_view name);

// Reads the rank's shard of `name` from `checkpoint` (a Checkpoint, or
// generated weights) into `out` (bf16,
// row-major in the shard's shape; sized as the shard). Errors as ShardOf and
// Checkpoint::ReadBf16Slice / ReadBf16.
absl::Status ReadShardBf16(const TensorReader& checkpoint, const ModelConfig& config,
                           const TensorParallelLayout& layout, absl::string_view name,
                           absl::Span<uint16_t> out);

// Moving a prompt's KV cache between workers of different TP degrees (a
// prefill worker at TP = src_size pushing to a decode worker at TP =
// dst_size): each KV head goes from one source rank holding it (the lowest,
// where KV heads are replicated) to every destination rank holding it.
struct KvHeadRoute {
  int32_t kv_head = 0;
  int32_t src_rank = 0;
  std::vector<int32_t> dst_ranks;  // Ascending.
};

// One route per KV head, in head order. Errors as MakeTensorParallelLayout
// for either size.
absl::StatusOr<std::vector<KvHeadRoute>> KvReshardRoutes(const ModelConfig& config,
                                                         int32_t src_size, int32_t dst_size);

}  // namespace trident::model

#endif  // TRIDENT_COMMON_MODEL_TENSOR_PARALLEL_TENSOR_PARALLEL_H_
