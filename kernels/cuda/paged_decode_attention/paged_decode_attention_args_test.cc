// Host-side parts of paged_decode_attention that need no GPU: the planner,
// the workspace size and argument checks (which return before any launch).

#include <cstdint>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/paged_decode_attention/paged_decode_attention.h"

namespace trident::kernels::cuda {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::StatusIs;

TEST(PlanDecodeTest, FillsTheSmsWithSplitsOfAtLeast256Tokens) {
  // 132 SMs x 4 = 528 CTA slots. 1 x 8 (sequence, kv head) items: 66 splits
  // fill them exactly.
  EXPECT_EQ(PlanDecode(1, 8, 32768, 132).num_splits, 66);
  // A 1000-token context allows only 3 splits of >= 256 tokens.
  EXPECT_EQ(PlanDecode(1, 8, 1000, 132).num_splits, 3);
  // 16 x 8 = 128 items: 4 splits (512 CTAs, one wave) rather than 5 (640:
  // a second wave of 112).
  EXPECT_EQ(PlanDecode(16, 8, 4096, 132).num_splits, 4);
  // 1024 items: two waves of 512 already; splitting adds nothing.
  EXPECT_EQ(PlanDecode(128, 8, 2048, 132).num_splits, 1);
  // 300 items: 7 splits make 2100 CTAs, 4 waves at 99.4%.
  EXPECT_EQ(PlanDecode(30, 10, 4096, 132).num_splits, 7);
  EXPECT_EQ(PlanDecode(1, 1, 1 << 24, 1000).num_splits, kMaxDecodeSplits);
  EXPECT_EQ(PlanDecode(4, 8, 255, 132).num_splits, 1);
  EXPECT_EQ(PlanDecode(0, 8, 4096, 132).num_splits, 1);
  EXPECT_EQ(PlanDecode(4, 8, 4096, 0).num_splits, 1);
}

TEST(DecodeWorkspaceBytesTest, PartialsAndStatsPerSplit) {
  EXPECT_EQ(DecodeWorkspaceBytes(DecodePlan{1}, 16, 32, 128), 0u);
  EXPECT_EQ(DecodeWorkspaceBytes(DecodePlan{5}, 16, 32, 128), 16u * 32 * 5 * (128 + 2) * 4);
}

// Valid except that no launch happens: the pointers are host dummies, so
// tests only change one field to something invalid.
PagedDecodeArgs ValidArgs(const void* dummy) {
  return PagedDecodeArgs{.q = dummy,
                         .q_stride = 32 * 128,
                         .out = const_cast<void*>(dummy),
                         .out_stride = 32 * 128,
                         .kv_base = dummy,
                         .block_stride_elems = 2 * 8 * 16 * 128,
                         .value_offset_elems = 8 * 16 * 128,
                         .block_size = 16,
                         .num_q_heads = 32,
                         .num_kv_heads = 8,
                         .head_dim = 128,
                         .block_tables = static_cast<const int32_t*>(dummy),
                         .max_blocks_per_seq = 4,
                         .context_lens = static_cast<const int32_t*>(dummy),
                         .batch = 2,
                         .scale = 0.088f};
}

class ArgsTest : public ::testing::Test {
 protected:
  void ExpectRejected(const PagedDecodeArgs& args, const char* field,
                      DecodePlan plan = DecodePlan{}) {
    EXPECT_THAT(LaunchPagedDecodeAttention(args, plan, nullptr, 0, nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(field)));
  }
  alignas(16) int32_t dummy_[16] = {};
};

TEST_F(ArgsTest, RejectsBadShapes) {
  PagedDecodeArgs a = ValidArgs(dummy_);
  a.head_dim = 96;
  ExpectRejected(a, "head_dim");
  a = ValidArgs(dummy_);
  a.num_q_heads = 12;
  ExpectRejected(a, "num_q_heads");
  a = ValidArgs(dummy_);
  a.num_q_heads = 72;  // Group 9.
  ExpectRejected(a, "num_q_heads");
  a = ValidArgs(dummy_);
  a.num_kv_heads = 0;
  ExpectRejected(a, "num_kv_heads");
  a = ValidArgs(dummy_);
  a.block_size = 0;
  ExpectRejected(a, "block_size");
  a = ValidArgs(dummy_);
  a.max_blocks_per_seq = 0;
  ExpectRejected(a, "max_blocks_per_seq");
  a = ValidArgs(dummy_);
  a.batch = -1;
  ExpectRejected(a, "batch");
  a = ValidArgs(dummy_);
  a.batch = 65536;
  ExpectRejected(a, "batch");
}

TEST_F(ArgsTest, RejectsBadStridesAndAlignment) {
  PagedDecodeArgs a = ValidArgs(dummy_);
  a.q_stride = 32 * 128 - 1;
  ExpectRejected(a, "q_stride");
  a = ValidArgs(dummy_);
  a.out_stride = 100;
  ExpectRejected(a, "out_stride");
  a = ValidArgs(dummy_);
  a.value_offset_elems -= 8;
  ExpectRejected(a, "value_offset_elems");
  a = ValidArgs(dummy_);
  a.block_stride_elems -= 8;
  ExpectRejected(a, "block_stride_elems");
  a = ValidArgs(dummy_);
  a.block_stride_elems += 4;
  ExpectRejected(a, "multiples of 8");
  a = ValidArgs(dummy_);
  a.kv_base = reinterpret_cast<const char*>(dummy_) + 8;
  ExpectRejected(a, "kv_base");
}

TEST_F(ArgsTest, RejectsNullPointersAndBadPlans) {
  PagedDecodeArgs a = ValidArgs(dummy_);
  a.block_tables = nullptr;
  ExpectRejected(a, "non-null");
  a = ValidArgs(dummy_);
  ExpectRejected(a, "num_splits", DecodePlan{0});
  ExpectRejected(a, "num_splits", DecodePlan{kMaxDecodeSplits + 1});
  // Two splits need a workspace.
  ExpectRejected(a, "workspace", DecodePlan{2});
  EXPECT_THAT(LaunchPagedDecodeAttention(a, DecodePlan{2}, dummy_, 64, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("DecodeWorkspaceBytes")));
  a.scale = INFINITY;
  ExpectRejected(a, "scale");
}

}  // namespace
}  // namespace trident::kernels::cuda
