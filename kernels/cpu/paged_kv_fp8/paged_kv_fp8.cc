#include "kernels/cpu/paged_kv_fp8/paged_kv_fp8.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/numeric/fp8.h"

namespace trident::kernels::cpu {
namespace {

int64_t RoundUp16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

unsigned char* BlockAt(const PagedKvFp8& kv, int64_t block) {
  return static_cast<unsigned char*>(kv.base) + block * kv.block_stride_bytes;
}

// Byte offsets within a block.
int64_t KOffset(const PagedKvFp8& kv, int32_t head, int32_t slot, int32_t dim) {
  return (static_cast<int64_t>(head) * kv.block_size + slot) * kv.head_dim + dim / 16 * 16 +
         Fp8FragmentPosition(dim % 16);
}
int64_t VOffset(const PagedKvFp8& kv, int32_t head, int32_t slot, int32_t dim) {
  const int64_t group = static_cast<int64_t>(head) * (kv.block_size / 16) + slot / 16;
  return kv.value_offset_bytes + (group * kv.head_dim + dim) * 16 + Fp8FragmentPosition(slot % 16);
}
int64_t ScaleOffset(const PagedKvFp8& kv, int which, int32_t head, int32_t slot) {
  return kv.scale_offset_bytes +
         ((static_cast<int64_t>(which) * kv.num_kv_heads + head) * kv.block_size + slot) * 4;
}

}  // namespace

int64_t Fp8BlockBytes(int32_t block_size, int32_t num_kv_heads, int32_t head_dim) {
  const int64_t kv_bytes = static_cast<int64_t>(num_kv_heads) * block_size * head_dim;
  return RoundUp16(2 * kv_bytes + static_cast<int64_t>(2) * num_kv_heads * block_size * 4);
}

PagedKvFp8 DensePagedKvFp8(void* base, int32_t block_size, int32_t num_kv_heads,
                           int32_t head_dim) {
  PagedKvFp8 kv;
  kv.base = base;
  kv.block_size = block_size;
  kv.num_kv_heads = num_kv_heads;
  kv.head_dim = head_dim;
  const int64_t kv_bytes = static_cast<int64_t>(num_kv_heads) * block_size * head_dim;
  kv.value_offset_bytes = kv_bytes;
  kv.scale_offset_bytes = 2 * kv_bytes;
  kv.block_stride_bytes = Fp8BlockBytes(block_size, num_kv_heads, head_dim);
  return kv;
}

absl::Status ValidatePagedKvFp8(const PagedKvFp8& kv) {
  if (kv.base == nullptr) return absl::InvalidArgumentError("PagedKvFp8: null base");
  if (kv.num_kv_heads <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("PagedKvFp8: num_kv_heads ", kv.num_kv_heads));
  }
  if (kv.block_size <= 0 || kv.block_size % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedKvFp8: block_size ", kv.block_size, " is not a positive multiple of 16"));
  }
  if (kv.head_dim <= 0 || kv.head_dim % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PagedKvFp8: head_dim ", kv.head_dim, " is not a positive multiple of 16"));
  }
  if (kv.block_stride_bytes % 16 != 0 || kv.value_offset_bytes % 16 != 0 ||
      kv.scale_offset_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(kv.base) % 16 != 0) {
    return absl::InvalidArgumentError(
        "PagedKvFp8: base, block_stride_bytes, value_offset_bytes and scale_offset_bytes must be "
        "16-byte aligned");
  }
  const int64_t kv_bytes = static_cast<int64_t>(kv.num_kv_heads) * kv.block_size * kv.head_dim;
  const int64_t scale_bytes = static_cast<int64_t>(2) * kv.num_kv_heads * kv.block_size * 4;
  // The three regions [offset, offset + size) lie in [0, stride) and apart.
  struct Region {
    int64_t begin;
    int64_t size;
  };
  const Region regions[] = {{0, kv_bytes},
                            {kv.value_offset_bytes, kv_bytes},
                            {kv.scale_offset_bytes, scale_bytes}};
  for (const Region& a : regions) {
    if (a.begin < 0 || a.begin + a.size > kv.block_stride_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PagedKvFp8: block_stride_bytes ", kv.block_stride_bytes,
          " does not hold K, V and the scales at offsets 0, ", kv.value_offset_bytes, ", ",
          kv.scale_offset_bytes));
    }
    for (const Region& b : regions) {
      if (&a != &b && a.begin < b.begin + b.size && b.begin < a.begin + a.size) {
        return absl::InvalidArgumentError(
            absl::StrCat("PagedKvFp8: K, V and the scales overlap (offsets 0, ",
                         kv.value_offset_bytes, ", ", kv.scale_offset_bytes, ")"));
      }
    }
  }
  return absl::OkStatus();
}

void AppendKvFp8(const PagedKvFp8& kv, const float* k, int64_t k_stride, const float* v,
                 int64_t v_stride, const int64_t* slots, int64_t num_tokens) {
  for (int64_t i = 0; i < num_tokens; ++i) {
    if (slots[i] < 0) continue;
    unsigned char* block = BlockAt(kv, slots[i] / kv.block_size);
    const int32_t slot = static_cast<int32_t>(slots[i] % kv.block_size);
    for (int which = 0; which < 2; ++which) {
      const float* row = which == 0 ? k + i * k_stride : v + i * v_stride;
      for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
        const absl::Span<const float> values(row + static_cast<int64_t>(h) * kv.head_dim,
                                             static_cast<size_t>(kv.head_dim));
        const float scale = numeric::Fp8E4M3Scale(values);
        std::memcpy(block + ScaleOffset(kv, which, h, slot), &scale, sizeof(scale));
        for (int32_t d = 0; d < kv.head_dim; ++d) {
          const int64_t at = which == 0 ? KOffset(kv, h, slot, d) : VOffset(kv, h, slot, d);
          block[at] = numeric::FloatToFp8E4M3(values[static_cast<size_t>(d)] / scale);
        }
      }
    }
  }
}

void ReadKvFp8(const PagedKvFp8& kv, int64_t block, int32_t slot, int32_t head, float* k,
               float* v) {
  const unsigned char* at = BlockAt(kv, block);
  float scales[2];
  for (int which = 0; which < 2; ++which) {
    std::memcpy(&scales[which], at + ScaleOffset(kv, which, head, slot), sizeof(float));
  }
  for (int32_t d = 0; d < kv.head_dim; ++d) {
    k[d] = numeric::Fp8E4M3ToFloat(at[KOffset(kv, head, slot, d)]) * scales[0];
    v[d] = numeric::Fp8E4M3ToFloat(at[VOffset(kv, head, slot, d)]) * scales[1];
  }
}

}  // namespace trident::kernels::cpu
