#include "common/model/tensor_parallel/kv_view.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kv/kv_layout.h"
#include "common/model/generate/model_gen.h"
#include "common/model/generate/random_weights.h"
#include "common/model/tensor_parallel/kv_reshard.h"
#include "common/model/tensor_parallel/tensor_parallel.h"
#include "common/model/tensor_parallel/tp_testing.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::model {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

using tp_testing::ConfigOf;
using tp_testing::RankSpec;

// The view is the TP = 1 pool: a read of whole blocks gives what
// PlanKvReshard moves from TP = size to TP = 1, and a write what it moves
// from TP = 1 to TP = size (the same byte runs, as sets).
TEST(KvViewTest, WholeBlocksMapAsTheReshardPlanMovesThem) {
  for (const std::string preset : {"llama3-tiny", "mistral-tiny"}) {
    const ModelConfig& config = ConfigOf(preset);
    for (int32_t size : {1, 2, 4}) {
      const kv::KvCacheSpec rank_spec = RankSpec(config, size, 9);
      auto view = KvView::Create(config, size, rank_spec);
      ASSERT_THAT(view.status(), IsOk());
      const kv::KvCacheSpec& spec = view->spec();
      EXPECT_EQ(spec.num_kv_heads, config.num_key_value_heads);
      const std::vector<int32_t> blocks = {3, 4, 7};
      for (bool write : {false, true}) {
        std::vector<KvViewPiece> mapped;
        for (int32_t l = 0; l < spec.num_layers; ++l) {
          for (int32_t b : blocks) {
            auto pieces = view->Map(spec.KeyOffsetBytes(l, b), spec.block_stride_bytes(), write);
            ASSERT_THAT(pieces.status(), IsOk());
            mapped.insert(mapped.end(), pieces->begin(), pieces->end());
          }
        }
        KvReshardRequest request;
        request.src_size = write ? 1 : size;
        request.dst_size = write ? size : 1;
        request.src_spec = write ? spec : rank_spec;
        request.dst_spec = write ? rank_spec : spec;
        request.src_blocks = blocks;
        request.dst_blocks = blocks;
        request.num_layers = spec.num_layers;
        auto runs = PlanKvReshard(config, request);
        ASSERT_THAT(runs.status(), IsOk());
        // Both split at head-run boundaries; compare byte by byte as sets of
        // (rank, view byte, rank byte) per run start, after expanding each
        // to its heads.
        const uint64_t head = uint64_t{16} * spec.head_dim * 2;
        std::vector<std::tuple<int32_t, uint64_t, uint64_t>> ours, plan;
        for (const KvViewPiece& p : mapped) {
          for (uint64_t at = 0; at < p.bytes; at += head) {
            ours.emplace_back(p.rank, p.view_offset + at, p.rank_offset + at);
          }
        }
        for (const KvCopyRun& r : *runs) {
          for (uint64_t at = 0; at < r.bytes; at += head) {
            if (write) {
              plan.emplace_back(r.dst_rank, r.src_offset + at, r.dst_offset + at);
            } else {
              plan.emplace_back(r.src_rank, r.dst_offset + at, r.src_offset + at);
            }
          }
        }
        std::sort(ours.begin(), ours.end());
        std::sort(plan.begin(), plan.end());
        EXPECT_EQ(ours, plan) << preset << " TP " << size << (write ? " write" : " read");
      }
    }
  }
}

// Ranges that start and end inside a head (a staging slot's cut) cover the
// range exactly once when read, and once per holding rank when written.
TEST(KvViewTest, ArbitraryRangesCoverEveryByte) {
  const ModelConfig& config = ConfigOf("mistral-tiny");  // 1 KV head: replicated at TP 2 and 4
  for (int32_t size : {2, 4}) {
    auto view = KvView::Create(config, size, RankSpec(config, size, 5));
    ASSERT_THAT(view.status(), IsOk());
    const uint64_t total = view->spec().TotalBytes();
    for (uint64_t offset : {uint64_t{0}, uint64_t{77}, total / 3}) {
      for (uint64_t bytes : {uint64_t{1}, uint64_t{5000}, total / 2}) {
        for (bool write : {false, true}) {
          auto pieces = view->Map(offset, bytes, write);
          ASSERT_THAT(pieces.status(), IsOk());
          uint64_t covered = 0;
          for (const KvViewPiece& p : *pieces) {
            EXPECT_GE(p.view_offset, offset);
            EXPECT_LE(p.view_offset + p.bytes, offset + bytes);
            EXPECT_LE(p.rank_offset + p.bytes, view->rank_spec().TotalBytes());
            covered += p.bytes;
          }
          EXPECT_EQ(covered, write ? bytes * size : bytes);
        }
      }
    }
  }
}

// Pools of `side`'s ranks holding the TP = 1 bytes `view_bytes` (every
// replica of a head).
std::vector<std::vector<uint8_t>> Scatter(const KvPoolSide& side, uint64_t rank_bytes,
                                          const std::vector<uint8_t>& view_bytes) {
  const int32_t ranks = side.view == nullptr ? 1 : side.view->size();
  std::vector<std::vector<uint8_t>> pools(ranks, std::vector<uint8_t>(rank_bytes, 0));
  auto pieces = side.view == nullptr ? std::vector<KvViewPiece>{{0, 0, 0, view_bytes.size()}}
                                     : *side.view->Map(0, view_bytes.size(), /*write=*/true);
  for (const KvViewPiece& p : pieces) {
    std::copy_n(view_bytes.begin() + p.view_offset, p.bytes, pools[p.rank].begin() + p.rank_offset);
  }
  return pools;
}

// Every replica of every byte of the pools, checked against `view_bytes`.
void ExpectHolds(const KvPoolSide& side, const std::vector<std::vector<uint8_t>>& pools,
                 const std::vector<uint8_t>& view_bytes, const std::string& what) {
  auto pieces = side.view == nullptr ? std::vector<KvViewPiece>{{0, 0, 0, view_bytes.size()}}
                                     : *side.view->Map(0, view_bytes.size(), /*write=*/true);
  for (const KvViewPiece& p : pieces) {
    for (uint64_t i = 0; i < p.bytes; ++i) {
      ASSERT_EQ(pools[p.rank][p.rank_offset + i], view_bytes[p.view_offset + i])
          << what << ": rank " << p.rank << " byte " << p.rank_offset + i;
    }
  }
}

// Copies between pools of any two TP degrees (or a plain pool) move exactly
// the range, into every replica, and nothing else.
TEST(KvViewTest, RankCopiesMoveTheRangeBetweenAnyDegrees) {
  for (const std::string preset : {"llama3-tiny", "mistral-tiny"}) {
    const ModelConfig& config = ConfigOf(preset);
    std::map<int32_t, KvView> views;
    for (int32_t size : {1, 2, 4}) {
      auto view = KvView::Create(config, size, RankSpec(config, size, 6));
      ASSERT_THAT(view.status(), IsOk());
      views.emplace(size, *view);
    }
    const kv::KvCacheSpec& spec = views.at(1).spec();
    const uint64_t total = spec.TotalBytes();
    // 0: a plain pool (no view).
    for (int32_t from : {0, 1, 2, 4}) {
      for (int32_t to : {0, 1, 2, 4}) {
        const KvPoolSide src{from == 0 ? nullptr : &views.at(from), total};
        const KvPoolSide dst{to == 0 ? nullptr : &views.at(to), total};
        const uint64_t src_rank_bytes = from == 0 ? total : views.at(from).rank_spec().TotalBytes();
        const uint64_t dst_rank_bytes = to == 0 ? total : views.at(to).rank_spec().TotalBytes();
        std::vector<uint8_t> src_view(total), dst_view(total);
        for (uint64_t i = 0; i < total; ++i) {
          src_view[i] = static_cast<uint8_t>(i * 131 + 7);
          dst_view[i] = static_cast<uint8_t>(i * 29 + 200);
        }
        auto src_pools = Scatter(src, src_rank_bytes, src_view);
        auto dst_pools = Scatter(dst, dst_rank_bytes, dst_view);
        // Two blocks of layer 1 into two others, and a cut inside heads.
        const uint64_t stride = spec.block_stride_bytes();
        const std::vector<std::array<uint64_t, 3>> moves = {
            {spec.KeyOffsetBytes(1, 2), spec.KeyOffsetBytes(1, 4), 2 * stride},
            {spec.KeyOffsetBytes(0, 1) + 77, spec.KeyOffsetBytes(spec.num_layers - 1, 3) + 77,
             stride + 300}};
        for (const auto& [src_at, dst_at, bytes] : moves) {
          auto copies = PlanRankCopies(src, src_at, dst, dst_at, bytes);
          ASSERT_THAT(copies.status(), IsOk());
          uint64_t moved = 0;
          for (const KvCopyRun& c : *copies) {
            ASSERT_LE(c.src_offset + c.bytes, src_rank_bytes);
            ASSERT_LE(c.dst_offset + c.bytes, dst_rank_bytes);
            std::copy_n(src_pools[c.src_rank].begin() + c.src_offset, c.bytes,
                        dst_pools[c.dst_rank].begin() + c.dst_offset);
            moved += c.bytes;
          }
          const int32_t replicas =
              to <= 1 ? 1
                      : std::max<int32_t>(1, to / std::max<int32_t>(1, config.num_key_value_heads));
          EXPECT_GE(moved, bytes);
          EXPECT_LE(moved, bytes * replicas);
          std::copy_n(src_view.begin() + src_at, bytes, dst_view.begin() + dst_at);
        }
        ExpectHolds(dst, dst_pools, dst_view, absl::StrCat(preset, " TP ", from, " -> TP ", to));
      }
    }
  }
  const ModelConfig& config = ConfigOf("llama3-tiny");
  auto view = KvView::Create(config, 2, RankSpec(config, 2, 4));
  ASSERT_THAT(view.status(), IsOk());
  const uint64_t total = view->spec().TotalBytes();
  EXPECT_THAT(PlanRankCopies({&*view, total}, 0, {nullptr, total}, 1, total).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside the pool")));
  EXPECT_THAT(PlanRankCopies({nullptr, total}, 1, {&*view, total}, 0, total).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(KvViewTest, RefusesRangesOutsideAndFp8) {
  const ModelConfig& config = ConfigOf("llama3-tiny");
  auto view = KvView::Create(config, 2, RankSpec(config, 2, 4));
  ASSERT_THAT(view.status(), IsOk());
  EXPECT_THAT(view->Map(view->spec().TotalBytes() - 1, 2, false).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside the view")));
  kv::KvCacheSpec fp8 = RankSpec(config, 2, 4);
  fp8.dtype = numeric::DType::kFP8E4M3;
  EXPECT_THAT(KvView::Create(config, 2, fp8).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("FP8")));
  EXPECT_THAT(KvView::Create(config, 3, RankSpec(config, 2, 4)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace trident::model
