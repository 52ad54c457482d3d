#include "common/kv/kv_layout.h"

#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status/error_details.h"
#include "common/status/status_macros.h"

namespace trident::kv {
namespace {

absl::Status CheckDimension(absl::string_view field, int64_t value, int64_t min) {
  if (value < min || value > kMaxKvDimension) {
    return InvalidArgumentForField(
        field, absl::StrCat("is ", value, "; must be in [", min, ", ", kMaxKvDimension, "]"));
  }
  return absl::OkStatus();
}

// Products are checked in 128 bits: four factors of at most 2^20 and an
// element size of at most 4 stay far below 2^128.
using Wide = unsigned __int128;

}  // namespace

int32_t KvCacheSpec::BlocksForBudget(uint64_t budget_bytes) const {
  const uint64_t per_block = BytesPerBlockAllLayers();
  if (per_block == 0) return 0;
  const uint64_t blocks = budget_bytes / per_block;
  return blocks > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())
             ? std::numeric_limits<int32_t>::max()
             : static_cast<int32_t>(blocks);
}

absl::Status Validate(const KvCacheSpec& spec) {
  TRIDENT_RETURN_IF_ERROR(CheckDimension("kv_cache.num_layers", spec.num_layers, 1));
  TRIDENT_RETURN_IF_ERROR(CheckDimension("kv_cache.num_kv_heads", spec.num_kv_heads, 1));
  TRIDENT_RETURN_IF_ERROR(CheckDimension("kv_cache.head_dim", spec.head_dim, 1));
  TRIDENT_RETURN_IF_ERROR(CheckDimension("kv_cache.block_size", spec.block_size, 1));
  TRIDENT_RETURN_IF_ERROR(CheckDimension("kv_cache.num_blocks", spec.num_blocks, 0));
  if (spec.fp8() && (spec.block_size % 16 != 0 || spec.head_dim % 16 != 0)) {
    return InvalidArgumentForField(
        "kv_cache.block_size",
        absl::StrCat("an FP8 cache needs block_size (", spec.block_size, ") and head_dim (",
                     spec.head_dim, ") multiples of 16"));
  }
  // FP8 blocks also hold 8 bytes of scales per token and kv head.
  const uint64_t per_element = spec.element_size_bytes();
  const Wide total =
      (Wide{2} * static_cast<uint64_t>(spec.num_kv_heads) * static_cast<uint64_t>(spec.block_size) *
           static_cast<uint64_t>(spec.head_dim + (spec.fp8() ? 4 : 0)) * per_element +
       15) *
      static_cast<uint64_t>(spec.num_blocks) * static_cast<uint64_t>(spec.num_layers);
  if (total > static_cast<Wide>(std::numeric_limits<int64_t>::max())) {
    return InvalidArgumentForField("kv_cache.num_blocks",
                                   "the cache's total size does not fit in 64 bits");
  }
  return absl::OkStatus();
}

trident::v1::DType ToProtoDType(numeric::DType dtype) {
  switch (dtype) {
    case numeric::DType::kF32:
      return trident::v1::DTYPE_FLOAT32;
    case numeric::DType::kF16:
      return trident::v1::DTYPE_FLOAT16;
    case numeric::DType::kBF16:
      return trident::v1::DTYPE_BFLOAT16;
    case numeric::DType::kFP8E4M3:
      return trident::v1::DTYPE_FLOAT8_E4M3;
  }
  return trident::v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<numeric::DType> FromProtoDType(trident::v1::DType dtype) {
  switch (dtype) {
    case trident::v1::DTYPE_FLOAT32:
      return numeric::DType::kF32;
    case trident::v1::DTYPE_FLOAT16:
      return numeric::DType::kF16;
    case trident::v1::DTYPE_BFLOAT16:
      return numeric::DType::kBF16;
    case trident::v1::DTYPE_FLOAT8_E4M3:
      return numeric::DType::kFP8E4M3;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "dtype must be DTYPE_FLOAT32, DTYPE_FLOAT16, DTYPE_BFLOAT16 or DTYPE_FLOAT8_E4M3, got ",
          trident::v1::DType_Name(dtype)));
  }
}

trident::v1::KvLayout ToProto(const KvCacheSpec& spec) {
  trident::v1::KvLayout layout;
  layout.set_num_layers(spec.num_layers);
  layout.set_num_kv_heads(spec.num_kv_heads);
  layout.set_head_dim(spec.head_dim);
  layout.set_dtype(ToProtoDType(spec.dtype));
  layout.set_block_size_tokens(spec.block_size);
  layout.set_block_layout(spec.fp8() ? trident::v1::KV_BLOCK_LAYOUT_FP8_GROUPED_SCALED
                                     : trident::v1::KV_BLOCK_LAYOUT_HEAD_TOKEN_DIM);
  layout.set_layer_stride_bytes(spec.layer_stride_bytes());
  layout.set_block_stride_bytes(spec.block_stride_bytes());
  layout.set_value_offset_bytes(spec.value_offset_bytes());
  return layout;
}

absl::StatusOr<KvCacheSpec> FromProto(const trident::v1::KvLayout& layout) {
  absl::StatusOr<numeric::DType> dtype = FromProtoDType(layout.dtype());
  if (!dtype.ok()) {
    return InvalidArgumentForField("kv_layout.dtype", dtype.status().message());
  }
  const trident::v1::KvBlockLayout want = *dtype == numeric::DType::kFP8E4M3
                                              ? trident::v1::KV_BLOCK_LAYOUT_FP8_GROUPED_SCALED
                                              : trident::v1::KV_BLOCK_LAYOUT_HEAD_TOKEN_DIM;
  if (layout.block_layout() != want) {
    return InvalidArgumentForField(
        "kv_layout.block_layout",
        absl::StrCat("is ", trident::v1::KvBlockLayout_Name(layout.block_layout()), "; a ",
                     trident::v1::DType_Name(layout.dtype()), " cache must be ",
                     trident::v1::KvBlockLayout_Name(want)));
  }
  TRIDENT_RETURN_IF_ERROR(CheckDimension("kv_layout.num_layers", layout.num_layers(), 1));
  TRIDENT_RETURN_IF_ERROR(CheckDimension("kv_layout.num_kv_heads", layout.num_kv_heads(), 1));
  TRIDENT_RETURN_IF_ERROR(CheckDimension("kv_layout.head_dim", layout.head_dim(), 1));
  TRIDENT_RETURN_IF_ERROR(
      CheckDimension("kv_layout.block_size_tokens", layout.block_size_tokens(), 1));

  KvCacheSpec spec;
  spec.num_layers = layout.num_layers();
  spec.num_kv_heads = layout.num_kv_heads();
  spec.head_dim = layout.head_dim();
  spec.block_size = layout.block_size_tokens();
  spec.dtype = *dtype;
  if (layout.value_offset_bytes() != spec.value_offset_bytes()) {
    return InvalidArgumentForField(
        "kv_layout.value_offset_bytes",
        absl::StrCat("is ", layout.value_offset_bytes(), "; the dimensions give ",
                     spec.value_offset_bytes()));
  }
  if (layout.block_stride_bytes() != spec.block_stride_bytes()) {
    return InvalidArgumentForField(
        "kv_layout.block_stride_bytes",
        absl::StrCat("is ", layout.block_stride_bytes(), "; the dimensions give ",
                     spec.block_stride_bytes()));
  }
  const uint64_t num_blocks = layout.layer_stride_bytes() / spec.block_stride_bytes();
  if (layout.layer_stride_bytes() % spec.block_stride_bytes() != 0 ||
      num_blocks > static_cast<uint64_t>(kMaxKvDimension)) {
    return InvalidArgumentForField(
        "kv_layout.layer_stride_bytes",
        absl::StrCat("is ", layout.layer_stride_bytes(),
                     "; must be a multiple of block_stride_bytes (", spec.block_stride_bytes(),
                     ") by at most ", kMaxKvDimension, " blocks"));
  }
  spec.num_blocks = static_cast<int32_t>(num_blocks);
  TRIDENT_RETURN_IF_ERROR(Validate(spec));
  return spec;
}

}  // namespace trident::kv
