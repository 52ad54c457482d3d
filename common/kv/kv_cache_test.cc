#include "common/kv/kv_cache.h"

#include <cstdint>
#include <cstring>

#include "common/kv/kv_layout.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::kv {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

KvCacheSpec SmallSpec() {
  return KvCacheSpec{.num_layers = 3,
                     .num_kv_heads = 2,
                     .head_dim = 8,
                     .block_size = 4,
                     .dtype = numeric::DType::kF32,
                     .num_blocks = 5};
}

TEST(HostKvCacheTest, AddressesFollowTheProtoLayout) {
  const KvCacheSpec spec = SmallSpec();
  absl::StatusOr<std::unique_ptr<HostKvCache>> cache = HostKvCache::Create(spec);
  ASSERT_THAT(cache, IsOk());
  const HostKvCache& c = **cache;
  EXPECT_EQ(c.size_bytes(), spec.TotalBytes());
  EXPECT_EQ(c.size_bytes(), 3u * 5 * 2 * 2 * 4 * 8 * 4);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c.data()) % 64, 0u);

  const trident::v1::KvLayout layout = ToProto(spec);
  const uintptr_t base = reinterpret_cast<uintptr_t>(c.data());
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(c.LayerBase(l)), base + l * layout.layer_stride_bytes());
    for (int32_t b = 0; b < spec.num_blocks; ++b) {
      const uintptr_t k = base + l * layout.layer_stride_bytes() + b * layout.block_stride_bytes();
      EXPECT_EQ(reinterpret_cast<uintptr_t>(c.KeyBlock(l, b)), k);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(c.ValueBlock(l, b)), k + layout.value_offset_bytes());
    }
  }
  // The last V block ends exactly at the end of the buffer.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c.ValueBlock(2, 4)) + spec.value_offset_bytes(),
            base + c.size_bytes());
}

TEST(HostKvCacheTest, StartsZeroedAndBlocksDoNotOverlap) {
  const KvCacheSpec spec = SmallSpec();
  absl::StatusOr<std::unique_ptr<HostKvCache>> cache = HostKvCache::Create(spec);
  ASSERT_THAT(cache, IsOk());
  HostKvCache& c = **cache;
  const unsigned char* bytes = static_cast<const unsigned char*>(c.data());
  for (size_t i = 0; i < c.size_bytes(); ++i) ASSERT_EQ(bytes[i], 0) << i;

  // Write a distinct value into every K and V entry; each must survive.
  const int64_t n = spec.value_offset_elements();
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    for (int32_t b = 0; b < spec.num_blocks; ++b) {
      float* k = static_cast<float*>(c.KeyBlock(l, b));
      float* v = static_cast<float*>(c.ValueBlock(l, b));
      for (int64_t i = 0; i < n; ++i) {
        k[i] = static_cast<float>((l * 100 + b) * 2);
        v[i] = static_cast<float>((l * 100 + b) * 2 + 1);
      }
    }
  }
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    for (int32_t b = 0; b < spec.num_blocks; ++b) {
      const float* k = static_cast<const float*>(c.KeyBlock(l, b));
      const float* v = static_cast<const float*>(c.ValueBlock(l, b));
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(k[i], static_cast<float>((l * 100 + b) * 2));
        ASSERT_EQ(v[i], static_cast<float>((l * 100 + b) * 2 + 1));
      }
    }
  }
}

TEST(HostKvCacheTest, LargeCacheIsHugePageAligned) {
  // 2 layers * 40 blocks * 64 KiB = 5 MiB: not a multiple of 2 MiB.
  const KvCacheSpec spec{.num_layers = 2,
                         .num_kv_heads = 8,
                         .head_dim = 128,
                         .block_size = 16,
                         .dtype = numeric::DType::kBF16,
                         .num_blocks = 40};
  absl::StatusOr<std::unique_ptr<HostKvCache>> cache = HostKvCache::Create(spec);
  ASSERT_THAT(cache, IsOk());
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*cache)->data()) % (2 << 20), 0u);
  EXPECT_EQ((*cache)->size_bytes(), 5u << 20);
  // Every byte is writable, the last one included.
  std::memset((*cache)->data(), 0xab, (*cache)->size_bytes());
  EXPECT_EQ(static_cast<unsigned char*>((*cache)->data())[(*cache)->size_bytes() - 1], 0xab);
}

TEST(HostKvCacheTest, RejectsInvalidSpecs) {
  KvCacheSpec spec = SmallSpec();
  spec.num_kv_heads = 0;
  EXPECT_THAT(HostKvCache::Create(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_kv_heads")));
  spec = SmallSpec();
  spec.num_blocks = 0;
  EXPECT_THAT(HostKvCache::Create(spec),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_blocks")));
}

TEST(HostKvCacheTest, ImpossiblyLargeCacheIsResourceExhausted) {
  // 2^20 layers * 2^20 blocks * 64 KiB = 2^56 bytes: more than any address space.
  const KvCacheSpec spec{.num_layers = kMaxKvDimension,
                         .num_kv_heads = 8,
                         .head_dim = 128,
                         .block_size = 16,
                         .dtype = numeric::DType::kBF16,
                         .num_blocks = kMaxKvDimension};
  ASSERT_THAT(Validate(spec), IsOk());
  EXPECT_THAT(HostKvCache::Create(spec), StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(HostKvCacheTest, NonexistentNumaNodeIsRejected) {
  EXPECT_THAT(HostKvCache::Create(SmallSpec(), /*numa_node=*/100000),
              StatusIs(::testing::AnyOf(absl::StatusCode::kInvalidArgument,
                                        absl::StatusCode::kFailedPrecondition)));
}

TEST(HostKvCacheTest, NumaNodeZeroWorksWhereNumaExists) {
  absl::StatusOr<std::unique_ptr<HostKvCache>> cache =
      HostKvCache::Create(SmallSpec(), /*numa_node=*/0);
  if (!cache.ok()) {
    // Only acceptable failure: no NUMA support at all on this machine.
    EXPECT_THAT(cache, StatusIs(absl::StatusCode::kFailedPrecondition));
    GTEST_SKIP() << "no NUMA support: " << cache.status();
  }
  EXPECT_EQ((*cache)->numa_node(), 0);
  std::memset((*cache)->data(), 1, (*cache)->size_bytes());
  EXPECT_EQ(static_cast<unsigned char*>((*cache)->KeyBlock(1, 1))[0], 1);
}

}  // namespace
}  // namespace trident::kv
