// A tensor-parallel group's KV pools seen as one pool in the TP = 1 layout
// (common/kv's, every KV head): what a KV transport moves, so that a prefill
// worker at one TP degree and a decode worker at another exchange the same
// bytes and each side's copier re-shards them into its ranks (prefill TP = 2
// to decode TP = 1, and the reverse, with no change to the transport).
//
// A byte range of the view maps to pieces of the ranks' pools: K (or V) of
// one (layer, block) is [num_kv_heads][block_size][head_dim], and rank r
// holds heads [first_kv_head, first_kv_head + kv_heads) of it, contiguous in
// both. Reading takes each head from the lowest rank holding it; writing
// goes to every rank holding it (KV heads replicated when fewer than ranks).

#ifndef TRIDENT_COMMON_MODEL_TENSOR_PARALLEL_KV_VIEW_H_
#define TRIDENT_COMMON_MODEL_TENSOR_PARALLEL_KV_VIEW_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kv/kv_layout.h"
#include "common/model/config.h"
#include "common/model/tensor_parallel/kv_reshard.h"
#include "common/model/tensor_parallel/tensor_parallel.h"

namespace trident::model {

// `bytes` at `view_offset` of the view are at `rank_offset` of rank `rank`'s
// pool.
struct KvViewPiece {
  int32_t rank = 0;
  uint64_t view_offset = 0;
  uint64_t rank_offset = 0;
  uint64_t bytes = 0;

  friend bool operator==(const KvViewPiece&, const KvViewPiece&) = default;
};

class KvView {
 public:
  // The view of `size` ranks' pools of `num_blocks` blocks each (bf16, the
  // model's layers and head_dim, `block_size` tokens a block). Errors as
  // MakeTensorParallelLayout; kFailedPrecondition for an FP8 cache (its
  // per-block scales do not split by head).
  static absl::StatusOr<KvView> Create(const ModelConfig& config, int32_t size,
                                       const kv::KvCacheSpec& rank_spec);

  // The view of `size` ranks' pools whose TP = 1 layout is `spec` (each
  // rank's spec derived: its share of the KV heads). Errors as Create;
  // kInvalidArgument when `spec` does not hold the model's KV heads.
  static absl::StatusOr<KvView> ForPool(const ModelConfig& config, int32_t size,
                                        const kv::KvCacheSpec& spec);

  // The view's spec (every KV head) and a rank's.
  const kv::KvCacheSpec& spec() const { return spec_; }
  const kv::KvCacheSpec& rank_spec() const { return rank_spec_; }
  int32_t size() const { return static_cast<int32_t>(layouts_.size()); }

  // The pieces of [offset, offset + bytes) of the view, in view order (for
  // a write, the pieces of one span for each rank holding it, rank order);
  // pieces adjacent in both the view and one rank's pool are merged.
  // kInvalidArgument for a range outside the view.
  absl::StatusOr<std::vector<KvViewPiece>> Map(uint64_t offset, uint64_t bytes, bool write) const;

 private:
  KvView(kv::KvCacheSpec spec, kv::KvCacheSpec rank_spec, std::vector<TensorParallelLayout> layouts)
      : spec_(spec), rank_spec_(rank_spec), layouts_(std::move(layouts)) {}

  kv::KvCacheSpec spec_;
  kv::KvCacheSpec rank_spec_;
  std::vector<TensorParallelLayout> layouts_;
};

// One end of a copy between pools in the same TP = 1 layout: a view of
// ranks' pools, or (view null) one pool of `pool_bytes` laid out as the
// TP = 1 layout itself.
struct KvPoolSide {
  const KvView* view = nullptr;
  uint64_t pool_bytes = 0;
};

// The rank-to-rank copies that move [src_at, src_at + bytes) of `src` into
// [dst_at, dst_at + bytes) of `dst`: each byte read from the lowest source
// rank holding it and written to every destination rank holding it; copies
// adjacent on both ranks merged. kInvalidArgument for a range outside
// either pool.
absl::StatusOr<std::vector<KvCopyRun>> PlanRankCopies(const KvPoolSide& src, uint64_t src_at,
                                                      const KvPoolSide& dst, uint64_t dst_at,
                                                      uint64_t bytes);

}  // namespace trident::model

#endif  // TRIDENT_COMMON_MODEL_TENSOR_PARALLEL_KV_VIEW_H_
