#include "common/kv/kv_layout.h"

#include <cstdint>
#include <limits>

#include "common/status/error_details.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::kv {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

// Llama-3-8B-like: 32 layers, 8 KV heads of 128, bf16.
KvCacheSpec Llama8bSpec() {
  return KvCacheSpec{.num_layers = 32,
                     .num_kv_heads = 8,
                     .head_dim = 128,
                     .block_size = 16,
                     .dtype = numeric::DType::kBF16,
                     .num_blocks = 1000};
}

TEST(KvCacheSpecTest, StridesFollowTheProtoFormulas) {
  const KvCacheSpec spec = Llama8bSpec();
  EXPECT_EQ(spec.value_offset_elements(), 8 * 16 * 128);
  EXPECT_EQ(spec.value_offset_bytes(), 8u * 16 * 128 * 2);
  EXPECT_EQ(spec.block_stride_bytes(), 2u * 8 * 16 * 128 * 2);
  EXPECT_EQ(spec.block_stride_elements(), 2 * 8 * 16 * 128);
  EXPECT_EQ(spec.layer_stride_bytes(), 1000u * 65536);
  EXPECT_EQ(spec.layer_stride_elements(), 1000 * 32768);
  EXPECT_EQ(spec.BytesPerBlockAllLayers(), 32u * 65536);
  EXPECT_EQ(spec.TotalBytes(), 32u * 1000 * 65536);
}

TEST(KvCacheSpecTest, OffsetsMatchTheProtoAddressFormulaForEveryLayerAndBlock) {
  KvCacheSpec spec{.num_layers = 3,
                   .num_kv_heads = 2,
                   .head_dim = 4,
                   .block_size = 5,
                   .dtype = numeric::DType::kF32,
                   .num_blocks = 7};
  const trident::v1::KvLayout layout = ToProto(spec);
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    for (int32_t b = 0; b < spec.num_blocks; ++b) {
      const uint64_t k = l * layout.layer_stride_bytes() + b * layout.block_stride_bytes();
      EXPECT_EQ(spec.KeyOffsetBytes(l, b), k) << "layer " << l << " block " << b;
      EXPECT_EQ(spec.ValueOffsetBytes(l, b), k + layout.value_offset_bytes());
    }
  }
  // 2 heads * 5 tokens * 4 dims * 4 bytes.
  EXPECT_EQ(layout.value_offset_bytes(), 160u);
  EXPECT_EQ(layout.block_stride_bytes(), 320u);
  EXPECT_EQ(layout.layer_stride_bytes(), 7u * 320);
}

TEST(KvCacheSpecTest, BlocksForBudgetDividesByPerBlockCost) {
  const KvCacheSpec spec = Llama8bSpec();  // 2 MiB per block over all layers.
  EXPECT_EQ(spec.BlocksForBudget(0), 0);
  EXPECT_EQ(spec.BlocksForBudget((uint64_t{2} << 20) - 1), 0);
  EXPECT_EQ(spec.BlocksForBudget(uint64_t{2} << 20), 1);
  EXPECT_EQ(spec.BlocksForBudget(uint64_t{80} << 30), 40960);
  EXPECT_EQ(spec.BlocksForBudget(std::numeric_limits<uint64_t>::max()),
            std::numeric_limits<int32_t>::max());
  EXPECT_EQ(KvCacheSpec{}.BlocksForBudget(1000), 0);
}

TEST(KvCacheSpecTest, ValidateAcceptsRealSpecsAndZeroBlocks) {
  EXPECT_THAT(Validate(Llama8bSpec()), IsOk());
  KvCacheSpec spec = Llama8bSpec();
  spec.num_blocks = 0;
  EXPECT_THAT(Validate(spec), IsOk());
}

TEST(KvCacheSpecTest, ValidateNamesTheBadField) {
  KvCacheSpec spec = Llama8bSpec();
  spec.head_dim = 0;
  EXPECT_THAT(Validate(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kv_cache.head_dim")));
  EXPECT_EQ(GetBadRequestField(Validate(spec)), "kv_cache.head_dim");

  spec = Llama8bSpec();
  spec.num_layers = -1;
  EXPECT_THAT(Validate(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kv_cache.num_layers")));
  spec = Llama8bSpec();
  spec.num_blocks = -1;
  EXPECT_THAT(Validate(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kv_cache.num_blocks")));
  spec = Llama8bSpec();
  spec.block_size = kMaxKvDimension + 1;
  EXPECT_THAT(Validate(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kv_cache.block_size")));
}

TEST(KvCacheSpecTest, ValidateRejectsTotalSizeOver64Bits) {
  const KvCacheSpec spec{.num_layers = kMaxKvDimension,
                         .num_kv_heads = kMaxKvDimension,
                         .head_dim = kMaxKvDimension,
                         .block_size = 16,
                         .dtype = numeric::DType::kF32,
                         .num_blocks = kMaxKvDimension};
  EXPECT_THAT(Validate(spec), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("64 bits")));
}

TEST(KvLayoutProtoTest, RoundTripsEveryDType) {
  for (const numeric::DType dtype :
       {numeric::DType::kF32, numeric::DType::kBF16, numeric::DType::kF16}) {
    KvCacheSpec spec = Llama8bSpec();
    spec.dtype = dtype;
    const trident::v1::KvLayout layout = ToProto(spec);
    EXPECT_EQ(layout.block_layout(), trident::v1::KV_BLOCK_LAYOUT_HEAD_TOKEN_DIM);
    EXPECT_EQ(layout.num_layers(), 32);
    EXPECT_EQ(layout.block_size_tokens(), 16);
    EXPECT_THAT(FromProto(layout), ::trident::testing::IsOkAndHolds(spec))
        << numeric::DTypeName(dtype);
  }
  EXPECT_EQ(ToProto(Llama8bSpec()).dtype(), trident::v1::DTYPE_BFLOAT16);
}

// FP8: a byte per element, then 8 bytes of scales per token and kv head
// after V, the block padded to 16 bytes; its own block layout.
TEST(KvCacheSpecTest, Fp8BlocksHoldTheScalesAfterV) {
  KvCacheSpec spec = Llama8bSpec();
  spec.dtype = numeric::DType::kFP8E4M3;
  EXPECT_TRUE(spec.fp8());
  EXPECT_EQ(spec.value_offset_bytes(), 8u * 16 * 128);
  EXPECT_EQ(spec.scale_offset_elements(), 2 * 8 * 16 * 128);
  EXPECT_EQ(spec.block_stride_bytes(), 2u * 8 * 16 * 128 + 8 * 16 * 8);
  EXPECT_EQ(spec.BytesPerBlockAllLayers(), 32u * (32768 + 1024));
  const trident::v1::KvLayout layout = ToProto(spec);
  EXPECT_EQ(layout.dtype(), trident::v1::DTYPE_FLOAT8_E4M3);
  EXPECT_EQ(layout.block_layout(), trident::v1::KV_BLOCK_LAYOUT_FP8_GROUPED_SCALED);
  EXPECT_THAT(FromProto(layout), ::trident::testing::IsOkAndHolds(spec));
  // An FP8 cache described as HEAD_TOKEN_DIM, and a bf16 one as FP8, are refused.
  trident::v1::KvLayout wrong = layout;
  wrong.set_block_layout(trident::v1::KV_BLOCK_LAYOUT_HEAD_TOKEN_DIM);
  EXPECT_THAT(FromProto(wrong), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr("KV_BLOCK_LAYOUT_FP8_GROUPED_SCALED")));
  wrong = ToProto(Llama8bSpec());
  wrong.set_block_layout(trident::v1::KV_BLOCK_LAYOUT_FP8_GROUPED_SCALED);
  EXPECT_THAT(FromProto(wrong),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kv_layout.block_layout")));
  // Blocks and head dims of multiples of 16 only.
  spec.block_size = 8;
  EXPECT_THAT(Validate(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiples of 16")));
}

TEST(KvLayoutProtoTest, RoundTripsZeroBlocks) {
  KvCacheSpec spec = Llama8bSpec();
  spec.num_blocks = 0;
  EXPECT_THAT(FromProto(ToProto(spec)), ::trident::testing::IsOkAndHolds(spec));
}

TEST(KvLayoutProtoTest, RejectsOtherBlockLayouts) {
  trident::v1::KvLayout layout = ToProto(Llama8bSpec());
  layout.set_block_layout(trident::v1::KV_BLOCK_LAYOUT_TOKEN_HEAD_DIM);
  EXPECT_THAT(FromProto(layout),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kv_layout.block_layout")));
  layout.set_block_layout(trident::v1::KV_BLOCK_LAYOUT_UNSPECIFIED);
  EXPECT_THAT(FromProto(layout),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kv_layout.block_layout")));
}

TEST(KvLayoutProtoTest, RejectsUnspecifiedDType) {
  trident::v1::KvLayout layout = ToProto(Llama8bSpec());
  layout.set_dtype(trident::v1::DTYPE_UNSPECIFIED);
  EXPECT_THAT(FromProto(layout),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kv_layout.dtype")));
}

TEST(KvLayoutProtoTest, RejectsStridesThatDisagreeWithDimensions) {
  const trident::v1::KvLayout good = ToProto(Llama8bSpec());

  trident::v1::KvLayout layout = good;
  layout.set_value_offset_bytes(good.value_offset_bytes() + 2);
  EXPECT_THAT(FromProto(layout), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("kv_layout.value_offset_bytes")));

  layout = good;
  layout.set_block_stride_bytes(good.block_stride_bytes() * 2);
  EXPECT_THAT(FromProto(layout), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("kv_layout.block_stride_bytes")));

  layout = good;
  layout.set_layer_stride_bytes(good.layer_stride_bytes() + 1);
  EXPECT_THAT(FromProto(layout), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("kv_layout.layer_stride_bytes")));

  layout = good;
  layout.set_layer_stride_bytes(good.block_stride_bytes() * (uint64_t{kMaxKvDimension} + 1));
  EXPECT_THAT(FromProto(layout), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("kv_layout.layer_stride_bytes")));

  layout = good;
  layout.set_num_kv_heads(0);
  EXPECT_THAT(FromProto(layout),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kv_layout.num_kv_heads")));
}

}  // namespace
}  // namespace trident::kv
