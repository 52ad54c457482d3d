// KvSlotOf against the CPU reference's AppendKv: every element of every
// token's k and v lies where the reference stored it, padding and slots
// past the cache store nothing.

#include "kernels/cuda/kv_append/kv_slot.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/paged_attention/paged_attention.h"

namespace trident::kernels::cuda {
namespace {

TEST(KvSlotTest, PlacesElementsWhereTheReferenceAppends) {
  // Strides with gaps: V 5 elements past K's end, the next block 7 past V's.
  constexpr int32_t kBlockSize = 4, kKvHeads = 2, kHeadDim = 3, kBlocks = 3;
  constexpr int64_t kHalf = int64_t{kKvHeads} * kBlockSize * kHeadDim;
  constexpr int64_t kValueOffset = kHalf + 5, kBlockStride = kValueOffset + kHalf + 7;
  std::vector<float> cache(kBlocks * kBlockStride, -1.0f);
  cpu::PagedKv kv;
  kv.base = cache.data();
  kv.dtype = numeric::DType::kF32;
  kv.block_size = kBlockSize;
  kv.num_kv_heads = kKvHeads;
  kv.head_dim = kHeadDim;
  kv.block_stride_elems = kBlockStride;
  kv.value_offset_elems = kValueOffset;
  ASSERT_TRUE(cpu::ValidatePagedKv(kv).ok());
  const std::vector<int64_t> slots = {0, 5, 11, 3, -1, 8};
  const int64_t tokens = static_cast<int64_t>(slots.size());
  constexpr int64_t kRow = int64_t{kKvHeads} * kHeadDim;
  // Element e of token t's K row is 1000 t + e; V's 1000 t + 500 + e.
  std::vector<float> k(tokens * kRow), v(tokens * kRow);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t e = 0; e < kRow; ++e) {
      k[t * kRow + e] = static_cast<float>(1000 * t + e);
      v[t * kRow + e] = static_cast<float>(1000 * t + 500 + e);
    }
  }
  cpu::AppendKv(kv, k.data(), kRow, v.data(), kRow, slots.data(), tokens);
  int checked = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    const KvSlot place =
        KvSlotOf(slots[t], kBlocks * kBlockSize, kBlockSize, kBlockStride, kValueOffset, kHeadDim);
    ASSERT_EQ(place.stored(), slots[t] >= 0) << "token " << t;
    if (!place.stored()) continue;
    for (int32_t h = 0; h < kKvHeads; ++h) {
      for (int32_t d = 0; d < kHeadDim; ++d) {
        EXPECT_EQ(cache[place.At(false, h, d)], k[t * kRow + h * kHeadDim + d]);
        EXPECT_EQ(cache[place.At(true, h, d)], v[t * kRow + h * kHeadDim + d]);
        checked += 2;
      }
    }
  }
  EXPECT_EQ(checked, 5 * 2 * kRow);
  // A slot at or past the capacity, or negative, stores nothing.
  EXPECT_FALSE(KvSlotOf(kBlocks * kBlockSize, kBlocks * kBlockSize, kBlockSize, kBlockStride,
                        kValueOffset, kHeadDim)
                   .stored());
  EXPECT_FALSE(KvSlotOf(-1, kBlocks * kBlockSize, kBlockSize, kBlockStride, kValueOffset, kHeadDim)
                   .stored());
}

}  // namespace
}  // namespace trident::kernels::cuda
