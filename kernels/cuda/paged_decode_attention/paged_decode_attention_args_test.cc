// Host-side parts of paged_decode_attention that need no GPU: the planner,
// the workspace size and argument checks (which return before any launch).

#include <algorithm>
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
  // Variant 2 keeps 2 CTAs per SM at head_dim 128: 264 slots on 132 SMs.
  // 1 x 8 (sequence, kv head) items: 33 splits fill them exactly.
  ASSERT_EQ(DecodeCtasPerSm(2, 128), 2);
  EXPECT_EQ(PlanDecodeVariant(1, 8, 128, 32768, 132, 2).num_splits, 33);
  // A 1000-token context allows only 3 splits of >= 256 tokens.
  EXPECT_EQ(PlanDecodeVariant(1, 8, 128, 1000, 132, 2).num_splits, 3);
  // 16 x 8 = 128 items: 2 splits (256 CTAs, one wave) rather than 3 (384:
  // a second wave of 120).
  EXPECT_EQ(PlanDecodeVariant(16, 8, 128, 4096, 132, 2).num_splits, 2);
  EXPECT_EQ(PlanDecodeVariant(16, 8, 128, 16384, 132, 2).num_splits, 2);
  // 512 and 1024 items: 1.94 and 3.9 waves already; splitting adds nothing.
  EXPECT_EQ(PlanDecodeVariant(64, 8, 128, 4096, 132, 2).num_splits, 1);
  EXPECT_EQ(PlanDecodeVariant(128, 8, 128, 2048, 132, 2).num_splits, 1);
  // 300 items: 1 split is 2 waves (the second 14% full); 7 splits make 2100
  // CTAs, 8 waves at 99.4%.
  EXPECT_EQ(PlanDecodeVariant(30, 10, 128, 4096, 132, 2).num_splits, 7);
  EXPECT_EQ(PlanDecodeVariant(1, 1, 128, 1 << 24, 1000, 2).num_splits, kMaxDecodeSplits);
  EXPECT_EQ(PlanDecodeVariant(4, 8, 128, 255, 132, 2).num_splits, 1);
  EXPECT_EQ(PlanDecodeVariant(0, 8, 128, 4096, 132, 2).num_splits, 1);
  EXPECT_EQ(PlanDecodeVariant(4, 8, 128, 4096, 0, 2).num_splits, 1);
  // PlanDecode is the default variant at head_dim 128, and mma_w2_s3 from
  // 2 items per SM on.
  EXPECT_EQ(PlanDecode(1, 8, 32768, 132).variant, kDefaultDecodeVariant);
  EXPECT_EQ(PlanDecode(32, 8, 576, 132).variant, kDefaultDecodeVariant);  // 256 items
  EXPECT_EQ(PlanDecode(33, 8, 576, 132).variant, kManyItemsDecodeVariant);
  EXPECT_EQ(PlanDecode(64, 8, 576, 132).variant, kManyItemsDecodeVariant);
  EXPECT_EQ(PlanDecode(64, 8, 576, 132).num_splits, 1);
  EXPECT_EQ(DefaultDecodeVariant(64, 8, 64, 132), kDefaultDecodeVariant);
  EXPECT_EQ(DefaultDecodeVariant(64, 8, 128, 0), kDefaultDecodeVariant);
  EXPECT_EQ(PlanDecode(1, 8, 32768, 132).num_splits,
            PlanDecodeVariant(1, 8, 128, 32768, 132, kDefaultDecodeVariant).num_splits);
  // Over the FP8 cache: mma_w4_s2, mma_w4_s3 from 2 items per SM on, and
  // mma_w8_s2 for one sequence of 8 kv heads and past head_dim 128.
  EXPECT_EQ(DefaultFp8DecodeVariant(1, 8, 128, 132), kDefaultDecodeVariant);  // 8 items
  EXPECT_EQ(DefaultFp8DecodeVariant(2, 8, 128, 132), kDefaultFp8DecodeVariant);
  EXPECT_EQ(DefaultFp8DecodeVariant(1, 8, 128, 100), kDefaultFp8DecodeVariant);
  EXPECT_EQ(DefaultFp8DecodeVariant(32, 8, 128, 132), kDefaultFp8DecodeVariant);  // 256 items
  EXPECT_EQ(DefaultFp8DecodeVariant(33, 8, 128, 132), kManyItemsFp8DecodeVariant);
  EXPECT_EQ(DefaultFp8DecodeVariant(128, 8, 64, 132), kManyItemsFp8DecodeVariant);
  EXPECT_EQ(DefaultFp8DecodeVariant(128, 8, 128, 0), kDefaultFp8DecodeVariant);
  EXPECT_EQ(DefaultFp8DecodeVariant(1, 8, 256, 132), kDefaultDecodeVariant);
  EXPECT_EQ(DefaultFp8DecodeVariant(128, 8, 256, 132), kDefaultDecodeVariant);
}

TEST(PlanDecodeTest, CountsEachVariantsResidentCtas) {
  // Legacy: 4 CTAs per SM, 528 slots: 66 splits of 8 items fill them.
  EXPECT_EQ(DecodeCtasPerSm(0, 128), 4);
  EXPECT_EQ(PlanDecodeVariant(1, 8, 128, 32768, 132, 0).num_splits, 66);
  EXPECT_EQ(PlanDecodeVariant(1, 8, 128, 32768, 132, 0).variant, 0);
  // Shared memory per CTA (warps x stages x 8 KiB at head_dim 128) sets the
  // count: 64 KiB -> 3, 96 KiB -> 2, 128 and 192 KiB -> 1, 48 KiB -> 4.
  EXPECT_EQ(DecodeCtasPerSm(1, 128), 3);
  EXPECT_EQ(DecodeCtasPerSm(2, 128), 2);
  EXPECT_EQ(DecodeCtasPerSm(3, 128), 1);
  EXPECT_EQ(DecodeCtasPerSm(6, 128), 4);
  EXPECT_EQ(DecodeCtasPerSm(7, 128), 1);
  // Half the bytes at head_dim 64; registers (128 per thread) cap 4 warps x
  // 4 CTAs.
  EXPECT_EQ(DecodeCtasPerSm(2, 64), 4);
  EXPECT_EQ(DecodeCtasPerSm(kNumDecodeVariants, 128), 0);
  // One CTA per SM: 16 splits of 8 items (128 CTAs), not 17 (a second wave).
  EXPECT_EQ(PlanDecodeVariant(1, 8, 128, 32768, 132, 3).num_splits, 16);
  // 8 warps: splits of at least 512 tokens.
  EXPECT_EQ(PlanDecodeVariant(1, 8, 128, 1000, 132, 5).num_splits, 1);
  for (int32_t v = 0; v < kNumDecodeVariants; ++v) {
    EXPECT_STRNE(DecodeVariantName(v), "invalid") << v;
  }
  EXPECT_STREQ(DecodeVariantName(-1), "invalid");
  EXPECT_STREQ(DecodeVariantName(kNumDecodeVariants), "invalid");
}

// PlanDecodeAuto: a few sequences at a short or middle context merge their
// splits in clusters (no merge kernel, no workspace); long contexts and
// large batches keep DefaultDecodeVariant's plan.
TEST(PlannerTest, ClusterPlansForFewSequences) {
  const DecodePlan short_context = PlanDecodeAuto(1, 8, 128, 576, 132);
  EXPECT_EQ(short_context.variant, kClusterDecodeVariant);
  EXPECT_EQ(short_context.num_splits, 8);  // 72 tokens a CTA, one wave
  EXPECT_EQ(DecodeWorkspaceBytes(short_context, 1, 32, 128), 0u);
  const DecodePlan middle = PlanDecodeAuto(1, 8, 128, 2048, 132);
  EXPECT_EQ(middle.variant, kClusterDecodeVariant);
  EXPECT_EQ(middle.num_splits, 8);
  // 4096 tokens: 512 a cluster CTA of 4 warps costs more than mma_w8_s2's 8
  // splits and their merge.
  const DecodePlan longer = PlanDecodeAuto(1, 8, 128, 4096, 132);
  EXPECT_EQ(longer.variant, kDefaultDecodeVariant);
  EXPECT_EQ(longer.num_splits, 8);
  // 32k tokens: 16 splits on one wave of the 8-warp kernel plus the merge
  // cost less than 8 splits of 4096 tokens.
  const DecodePlan long_context = PlanDecodeAuto(1, 8, 128, 32768, 132);
  EXPECT_EQ(long_context.variant, kDefaultDecodeVariant);
  EXPECT_EQ(long_context.num_splits, 16);
  // 64 x 8 x 8 CTAs do not fit one wave: the many-items variant.
  EXPECT_EQ(PlanDecodeAuto(64, 8, 128, 576, 132).variant, kManyItemsDecodeVariant);
  EXPECT_NE(PlanDecodeAuto(1, 8, 256, 576, 132).variant, kClusterDecodeVariant);
  // A cluster variant's splits past 8 take the merge kernel and its workspace.
  EXPECT_GT(DecodeWorkspaceBytes(DecodePlan{16, kClusterDecodeVariant}, 1, 32, 128), 0u);
  EXPECT_EQ(DecodeWorkspaceBytes(DecodePlan{1, kClusterDecodeVariant}, 1, 32, 128), 0u);
  // A cluster plan never splits past 8, nor below one chunk per warp.
  EXPECT_EQ(PlanDecodeVariant(1, 8, 128, 100000, 132, kClusterDecodeVariant).num_splits, 8);
  EXPECT_EQ(PlanDecodeVariant(1, 8, 128, 64, 132, kClusterDecodeVariant).num_splits, 1);
}

// The backend sizes its workspace once for the longest context; that only
// works if no shorter context gets more splits.
TEST(PlanDecodeTest, SplitsNeverGrowAsTheContextShrinks) {
  for (int32_t batch = 1; batch <= 40; batch += 3) {
    for (int32_t kv_heads : {1, 8}) {
      int32_t previous = 1;
      for (int32_t context = 1; context <= 40000; context += 13) {
        const int32_t splits = PlanDecode(batch, kv_heads, context, 132).num_splits;
        ASSERT_GE(splits, previous)
            << "batch " << batch << " kv heads " << kv_heads << " context " << context;
        previous = splits;
      }
    }
  }
}

TEST(MaxDecodeWorkspaceBytesTest, CoversEveryBatchAndShorterContext) {
  const size_t most = MaxDecodeWorkspaceBytes(64, 8, 32, 128, 32768, 132);
  size_t seen = 0;
  for (int32_t batch = 1; batch <= 64; ++batch) {
    for (int32_t context : {1, 300, 1000, 4096, 10000, 32768}) {
      const size_t bytes = DecodeWorkspaceBytes(PlanDecode(batch, 8, context, 132), batch, 32, 128);
      EXPECT_LE(bytes, most) << "batch " << batch << " context " << context;
      // The backend's plans (PlanDecodeAuto) fit the same workspace.
      EXPECT_LE(DecodeWorkspaceBytes(PlanDecodeAuto(batch, 8, 128, context, 132), batch, 32, 128),
                most)
          << "batch " << batch << " context " << context;
      seen = std::max(seen, bytes);
    }
  }
  EXPECT_EQ(seen, most);  // Reached at the longest context.
  EXPECT_EQ(MaxDecodeWorkspaceBytes(0, 8, 32, 128, 32768, 132), 0u);
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
  for (int32_t head_dim : {0, 8, 88, 272}) {
    a.head_dim = head_dim;  // Not a multiple of 16 in [16, 256].
    ExpectRejected(a, "head_dim");
  }
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

TEST_F(ArgsTest, RejectsBadFp8Layouts) {
  PagedDecodeArgs a = ValidArgs(dummy_);
  a.kv_dtype = DecodeKvDtype::kFp8E4M3;
  // K and V of 8 heads x 16 tokens x 128 dims are 16 KiB each in bytes.
  a.value_offset_elems = 16384;
  a.scale_offset_elems = 32768;
  a.block_stride_elems = 32768 + 2 * 8 * 16 * 4;
  PagedDecodeArgs b = a;
  b.block_size = 8;
  b.value_offset_elems = 8192;
  ExpectRejected(b, "multiple of 16 for an FP8 cache");
  b = a;
  b.scale_offset_elems -= 16;
  ExpectRejected(b, "scale_offset_elems");
  b = a;
  b.block_stride_elems -= 16;
  ExpectRejected(b, "and scales");
  b = a;
  b.scale_offset_elems += 8;
  b.block_stride_elems += 16;
  ExpectRejected(b, "multiples of 16");
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
  ExpectRejected(a, "variant", DecodePlan{1, -1});
  ExpectRejected(a, "variant", DecodePlan{1, kNumDecodeVariants});
  a.scale = INFINITY;
  ExpectRejected(a, "scale");
}

}  // namespace
}  // namespace trident::kernels::cuda
