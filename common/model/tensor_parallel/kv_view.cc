#include "common/model/tensor_parallel/kv_view.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace trident::model {

absl::StatusOr<KvView> KvView::Create(const ModelConfig& config, int32_t size,
                                      const kv::KvCacheSpec& rank_spec) {
  if (rank_spec.fp8()) {
    return absl::FailedPreconditionError(
        "an FP8 KV cache is not seen as one pool over tensor-parallel ranks");
  }
  std::vector<TensorParallelLayout> layouts;
  for (int32_t r = 0; r < size; ++r) {
    absl::StatusOr<TensorParallelLayout> layout = MakeTensorParallelLayout(config, size, r);
    if (!layout.ok()) return layout.status();
    layouts.push_back(*layout);
  }
  if (rank_spec.num_kv_heads != layouts[0].kv_heads) {
    return absl::InvalidArgumentError(absl::StrCat("a rank's KV pool holds ",
                                                   rank_spec.num_kv_heads, " heads; its layout ",
                                                   layouts[0].kv_heads));
  }
  kv::KvCacheSpec spec = rank_spec;
  spec.num_kv_heads = config.num_key_value_heads;
  if (absl::Status valid = kv::Validate(spec); !valid.ok()) return valid;
  return KvView(spec, rank_spec, std::move(layouts));
}

absl::StatusOr<KvView> KvView::ForPool(const ModelConfig& config, int32_t size,
                                       const kv::KvCacheSpec& spec) {
  if (spec.num_kv_heads != config.num_key_value_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a KV pool of ", spec.num_kv_heads, " heads for a model of ", config.num_key_value_heads));
  }
  absl::StatusOr<TensorParallelLayout> layout = MakeTensorParallelLayout(config, size, 0);
  if (!layout.ok()) return layout.status();
  kv::KvCacheSpec rank_spec = spec;
  rank_spec.num_kv_heads = layout->kv_heads;
  return Create(config, size, rank_spec);
}

absl::StatusOr<std::vector<KvViewPiece>> KvView::Map(uint64_t offset, uint64_t bytes,
                                                     bool write) const {
  const uint64_t total = spec_.TotalBytes();
  if (offset > total || bytes > total - offset) {
    return absl::InvalidArgumentError(absl::StrCat("KV view range [", offset, ", +", bytes,
                                                   ") outside the view of ", total, " bytes"));
  }
  const uint64_t head_bytes =
      uint64_t{1} * spec_.block_size * spec_.head_dim * spec_.element_size_bytes();
  const uint64_t half = spec_.value_offset_bytes();  // K (or V) of one block, all heads
  const uint64_t rank_half = rank_spec_.value_offset_bytes();
  std::vector<KvViewPiece> pieces;
  auto add = [&](int32_t rank, uint64_t view_at, uint64_t rank_at, uint64_t n) {
    if (!pieces.empty()) {
      KvViewPiece& last = pieces.back();
      if (last.rank == rank && last.view_offset + last.bytes == view_at &&
          last.rank_offset + last.bytes == rank_at) {
        last.bytes += n;
        return;
      }
    }
    pieces.push_back({rank, view_at, rank_at, n});
  };
  uint64_t at = offset;
  const uint64_t end = offset + bytes;
  while (at < end) {
    // (layer, block, K or V) = which half; the head and the byte within it.
    const uint64_t which = at / half;
    const uint64_t within = at % half;
    const int32_t head = static_cast<int32_t>(within / head_bytes);
    const uint64_t n = std::min(end - at, (uint64_t{1} + head) * head_bytes - within);
    const uint64_t in_head = within % head_bytes;
    bool first = true;
    for (const TensorParallelLayout& l : layouts_) {
      if (head < l.first_kv_head || head >= l.first_kv_head + l.kv_heads) continue;
      if (!write && !first) break;
      first = false;
      const uint64_t rank_at =
          which * rank_half + uint64_t(head - l.first_kv_head) * head_bytes + in_head;
      add(l.rank, at, rank_at, n);
    }
    at += n;
  }
  if (write) {
    // Rank order within the whole range keeps each rank's pieces merged.
    std::stable_sort(pieces.begin(), pieces.end(),
                     [](const KvViewPiece& a, const KvViewPiece& b) { return a.rank < b.rank; });
    std::vector<KvViewPiece> merged;
    for (const KvViewPiece& p : pieces) {
      if (!merged.empty() && merged.back().rank == p.rank &&
          merged.back().view_offset + merged.back().bytes == p.view_offset &&
          merged.back().rank_offset + merged.back().bytes == p.rank_offset) {
        merged.back().bytes += p.bytes;
      } else {
        merged.push_back(p);
      }
    }
    pieces = std::move(merged);
  }
  return pieces;
}

namespace {

absl::StatusOr<std::vector<KvViewPiece>> MapSide(const KvPoolSide& side, uint64_t offset,
                                                 uint64_t bytes, bool write) {
  if (side.view != nullptr) return side.view->Map(offset, bytes, write);
  if (offset > side.pool_bytes || bytes > side.pool_bytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV range [", offset, ", +", bytes, ") outside the pool of ", side.pool_bytes, " bytes"));
  }
  return std::vector<KvViewPiece>{{0, offset, offset, bytes}};
}

}  // namespace

absl::StatusOr<std::vector<KvCopyRun>> PlanRankCopies(const KvPoolSide& src, uint64_t src_at,
                                                      const KvPoolSide& dst, uint64_t dst_at,
                                                      uint64_t bytes) {
  absl::StatusOr<std::vector<KvViewPiece>> reads = MapSide(src, src_at, bytes, /*write=*/false);
  if (!reads.ok()) return reads.status();
  absl::StatusOr<std::vector<KvViewPiece>> writes = MapSide(dst, dst_at, bytes, /*write=*/true);
  if (!writes.ok()) return writes.status();
  // Reads are in view order and cover the range once: each write's span
  // (in the source's view offsets) meets a run of them.
  std::vector<KvCopyRun> copies;
  for (const KvViewPiece& w : *writes) {
    const uint64_t begin = w.view_offset - dst_at + src_at;
    const uint64_t end = begin + w.bytes;
    auto r = std::upper_bound(reads->begin(), reads->end(), begin,
                              [](uint64_t at, const KvViewPiece& p) { return at < p.view_offset; });
    if (r != reads->begin()) --r;
    for (; r != reads->end() && r->view_offset < end; ++r) {
      const uint64_t lo = std::max(begin, r->view_offset);
      const uint64_t hi = std::min(end, r->view_offset + r->bytes);
      if (lo >= hi) continue;
      const KvCopyRun c{.src_rank = r->rank,
                        .dst_rank = w.rank,
                        .src_offset = r->rank_offset + (lo - r->view_offset),
                        .dst_offset = w.rank_offset + (lo - begin),
                        .bytes = hi - lo};
      if (!copies.empty()) {
        KvCopyRun& last = copies.back();
        if (last.src_rank == c.src_rank && last.dst_rank == c.dst_rank &&
            last.src_offset + last.bytes == c.src_offset &&
            last.dst_offset + last.bytes == c.dst_offset) {
          last.bytes += c.bytes;
          continue;
        }
      }
      copies.push_back(c);
    }
  }
  return copies;
}

}  // namespace trident::model
