#include "common/backend/host_kv_copier.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::backend {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

KvMemory PoolOf(std::vector<uint8_t>& pool) {
  KvMemory memory;
  memory.base = pool.data();
  memory.bytes = pool.size();
  return memory;
}

TEST(HostKvCopierTest, CopiesRangesBackToBackAndBack) {
  std::vector<uint8_t> pool(64);
  std::iota(pool.begin(), pool.end(), 0);
  auto copier = HostKvCopier::Create(PoolOf(pool));
  ASSERT_THAT(copier.status(), IsOk());
  const std::vector<KvRange> ranges = {{.offset_bytes = 40, .length_bytes = 8},
                                       {.offset_bytes = 4, .length_bytes = 4}};
  auto staging = (*copier)->AllocateHost(TotalBytes(ranges));
  ASSERT_THAT(staging.status(), IsOk());

  ASSERT_THAT((*copier)->CopyToHost(ranges, (*staging)->data()), IsOk());
  const std::vector<uint8_t> staged((*staging)->data(), (*staging)->data() + 12);
  EXPECT_EQ(staged, (std::vector<uint8_t>{40, 41, 42, 43, 44, 45, 46, 47, 4, 5, 6, 7}));

  const std::vector<KvRange> back = {{.offset_bytes = 0, .length_bytes = 12}};
  ASSERT_THAT((*copier)->CopyFromHost((*staging)->data(), back), IsOk());
  EXPECT_EQ(std::vector<uint8_t>(pool.begin(), pool.begin() + 12), staged);
  EXPECT_EQ((*copier)->copies_to_host(), 1);
  EXPECT_EQ((*copier)->copies_from_host(), 1);
}

TEST(HostKvCopierTest, RejectsRangesOutsideThePoolWithoutCopying) {
  std::vector<uint8_t> pool(64, 7);
  auto copier = HostKvCopier::Create(PoolOf(pool));
  ASSERT_THAT(copier.status(), IsOk());
  std::vector<uint8_t> host(64, 1);
  const std::vector<KvRange> ranges = {{.offset_bytes = 0, .length_bytes = 8},
                                       {.offset_bytes = 60, .length_bytes = 8}};
  EXPECT_THAT((*copier)->CopyFromHost(host.data(), ranges),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ranges[1]")));
  EXPECT_EQ(pool, std::vector<uint8_t>(64, 7));
  const std::vector<KvRange> empty = {{.offset_bytes = 0, .length_bytes = 0}};
  EXPECT_THAT((*copier)->CopyToHost(empty, host.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ranges[0]")));
}

TEST(HostKvCopierTest, RefusesDeviceMemory) {
  std::vector<uint8_t> pool(64);
  KvMemory memory = PoolOf(pool);
  memory.device = true;
  EXPECT_THAT(HostKvCopier::Create(memory).status(), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace trident::backend
