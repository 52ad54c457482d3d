#ifndef TRIDENT_COMMON_KV_KV_LAYOUT_H_
#define TRIDENT_COMMON_KV_KV_LAYOUT_H_

// The shape of a worker's paged KV cache and its in-memory layout, which is
// exactly the one `trident.v1.KvLayout` (proto/trident/v1/cluster.proto)
// describes with `KV_BLOCK_LAYOUT_HEAD_TOKEN_DIM`, so that a peer writing KV
// over UCX computes the same addresses as the local engine:
//
//   base ─┬─ layer 0 ─┬─ block 0 ─┬─ K [num_kv_heads][block_size][head_dim]
//         │           │           └─ V [num_kv_heads][block_size][head_dim]
//         │           ├─ block 1 ─┬─ K ...
//         │           ...         └─ V ...
//         ├─ layer 1 ─┬─ block 0 ...
//         ...
//
//   K(l, b) = base + l * layer_stride_bytes + b * block_stride_bytes
//   V(l, b) = K(l, b) + value_offset_bytes
//   value_offset_bytes = num_kv_heads * block_size * head_dim * elem_bytes
//   block_stride_bytes = 2 * value_offset_bytes
//   layer_stride_bytes = num_blocks * block_stride_bytes
//
// Within K (or V) of one block, the element for (head h, token slot t, dim d)
// is at index (h * block_size + t) * head_dim + d.

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/numeric/dtype.h"
#include "trident/v1/cluster.pb.h"

namespace trident::kv {

// Upper bound on any one dimension of a spec; far above real models and low
// enough that no product of dimensions overflows before validation sees it.
inline constexpr int32_t kMaxKvDimension = 1 << 20;

// Shape of a KV cache: per-layer K and V entries for `num_blocks` blocks of
// `block_size` tokens each. A plain value; every derived quantity is computed
// from the six fields. Call `Validate` before trusting the derived sizes.
struct KvCacheSpec {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  // Tokens per block.
  int32_t block_size = 16;
  numeric::DType dtype = numeric::DType::kBF16;
  int32_t num_blocks = 0;

  size_t element_size_bytes() const { return numeric::ElementSize(dtype); }
  // An FP8 E4M3 cache (KV_BLOCK_LAYOUT_FP8_GROUPED_SCALED,
  // kernels/cpu/paged_kv_fp8): a byte per element, V transposed in groups
  // of 16 tokens, and each block's f32 scales after its V.
  bool fp8() const { return dtype == numeric::DType::kFP8E4M3; }

  // Elements of K (or of V) in one block of one layer:
  // num_kv_heads * block_size * head_dim.
  int64_t value_offset_elements() const { return int64_t{num_kv_heads} * block_size * head_dim; }
  // FP8: from a block's start to its scales (2 per token and kv head, f32).
  int64_t scale_offset_elements() const { return 2 * value_offset_elements(); }
  // Elements of K and V (and FP8's scales, the block padded to 16 bytes) of
  // one block of one layer.
  int64_t block_stride_elements() const {
    if (!fp8()) return 2 * value_offset_elements();
    const int64_t bytes = scale_offset_elements() + int64_t{8} * num_kv_heads * block_size;
    return (bytes + 15) / 16 * 16;
  }
  // Elements of one layer: every block's K and V.
  int64_t layer_stride_elements() const { return num_blocks * block_stride_elements(); }

  uint64_t value_offset_bytes() const { return value_offset_elements() * element_size_bytes(); }
  uint64_t block_stride_bytes() const { return block_stride_elements() * element_size_bytes(); }
  uint64_t layer_stride_bytes() const { return layer_stride_elements() * element_size_bytes(); }

  // Bytes one block occupies summed over all layers (K and V): what one more
  // block of capacity costs. Independent of `num_blocks`.
  uint64_t BytesPerBlockAllLayers() const { return num_layers * block_stride_bytes(); }

  // Bytes of the whole cache: num_layers * layer_stride_bytes.
  uint64_t TotalBytes() const { return num_layers * layer_stride_bytes(); }

  // Offset from the cache base of the K entries of (`layer`, `block`), and of
  // the V entries. REQUIRES: 0 <= layer < num_layers, 0 <= block < num_blocks.
  uint64_t KeyOffsetBytes(int32_t layer, int32_t block) const {
    return layer * layer_stride_bytes() + block * block_stride_bytes();
  }
  uint64_t ValueOffsetBytes(int32_t layer, int32_t block) const {
    return KeyOffsetBytes(layer, block) + value_offset_bytes();
  }

  // How many blocks fit in `budget_bytes` with this spec's per-block cost
  // (`BytesPerBlockAllLayers`), capped at INT32_MAX; `num_blocks` is ignored.
  // 0 when the spec's per-block cost is 0 (an invalid spec).
  int32_t BlocksForBudget(uint64_t budget_bytes) const;

  friend bool operator==(const KvCacheSpec&, const KvCacheSpec&) = default;
};

// OK if every dimension is in [1, kMaxKvDimension] (num_blocks may be 0) and
// the total size fits in int64; else INVALID_ARGUMENT naming the field
// ("kv_cache.num_layers", ...).
absl::Status Validate(const KvCacheSpec& spec);

// The proto description of `spec`'s layout (block_layout is always
// KV_BLOCK_LAYOUT_HEAD_TOKEN_DIM). REQUIRES: Validate(spec).ok().
trident::v1::KvLayout ToProto(const KvCacheSpec& spec);

// The spec a `KvLayout` describes. `num_blocks` is layer_stride_bytes /
// block_stride_bytes. INVALID_ARGUMENT naming the offending field
// ("kv_layout.<field>") when the layout is not one this engine produces:
// unspecified or unknown dtype, a block layout other than HEAD_TOKEN_DIM,
// dimensions out of range, or strides that disagree with the dimensions.
absl::StatusOr<KvCacheSpec> FromProto(const trident::v1::KvLayout& layout);

// Conversions between numeric::DType and trident.v1.DType. The proto's
// DTYPE_UNSPECIFIED (or an unknown value) gives INVALID_ARGUMENT.
trident::v1::DType ToProtoDType(numeric::DType dtype);
absl::StatusOr<numeric::DType> FromProtoDType(trident::v1::DType dtype);

}  // namespace trident::kv

#endif  // TRIDENT_COMMON_KV_KV_LAYOUT_H_
