#include "common/cpu/threads.h"

#include <omp.h>
#include <sched.h>

#include <set>
#include <vector>

#include "common/cpu/cpu_features.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::cpu {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

cpu_set_t AffinityMask() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  EXPECT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  return mask;
}

TEST(CpuPlacementTest, ListsEveryCpuOfTheAffinityMaskOnceCoresFirst) {
  const cpu_set_t mask = AffinityMask();
  absl::StatusOr<CpuPlacement> placement = GetCpuPlacement();
  ASSERT_THAT(placement, IsOk());
  EXPECT_EQ(static_cast<int>(placement->cpus.size()), CPU_COUNT(&mask));
  const std::set<int> distinct(placement->cpus.begin(), placement->cpus.end());
  EXPECT_EQ(distinct.size(), placement->cpus.size());
  for (int cpu : placement->cpus) EXPECT_TRUE(CPU_ISSET(cpu, &mask)) << "CPU " << cpu;
  EXPECT_GE(placement->num_physical_cores, 1);
  EXPECT_LE(placement->num_physical_cores, static_cast<int>(placement->cpus.size()));
  EXPECT_LE(placement->num_physical_cores, GetCpuFeatures().physical_cores);
}

TEST(ConfigureCpuThreadsTest, DefaultIsOnePinnedThreadPerPhysicalCore) {
  const cpu_set_t original_mask = AffinityMask();
  absl::StatusOr<CpuPlacement> placement = GetCpuPlacement();
  ASSERT_THAT(placement, IsOk());
  ASSERT_THAT(ConfigureCpuThreads(/*num_threads=*/0, /*pin=*/true), IsOk());
  const int n = CpuThreadCount();
  EXPECT_EQ(n, placement->num_physical_cores);

  // Each thread of the next region (the pool is reused) is bound to exactly
  // its CPU.
  std::vector<int> bound(n, -1);
  std::vector<int> bound_count(n, -1);
#pragma omp parallel num_threads(n)
  {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    const int thread = omp_get_thread_num();
    if (sched_getaffinity(0, sizeof(mask), &mask) == 0) {
      bound_count[thread] = CPU_COUNT(&mask);
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (CPU_ISSET(cpu, &mask)) bound[thread] = cpu;
      }
    }
  }
  for (int thread = 0; thread < n; ++thread) {
    EXPECT_EQ(bound_count[thread], 1) << "thread " << thread;
    EXPECT_EQ(bound[thread], placement->cpus[thread]) << "thread " << thread;
  }

  // A second call starts from the original mask, not the pinned one.
  ASSERT_THAT(ConfigureCpuThreads(static_cast<int>(placement->cpus.size()), /*pin=*/true), IsOk());
  EXPECT_EQ(CpuThreadCount(), static_cast<int>(placement->cpus.size()));
  ASSERT_EQ(sched_setaffinity(0, sizeof(original_mask), &original_mask), 0);
}

TEST(ConfigureCpuThreadsTest, ExplicitCountWithoutPinningMayExceedTheCpus) {
  const cpu_set_t mask = AffinityMask();
  const int n = CPU_COUNT(&mask) + 1;
  ASSERT_THAT(ConfigureCpuThreads(n, /*pin=*/false), IsOk());
  EXPECT_EQ(CpuThreadCount(), n);
}

TEST(ConfigureCpuThreadsTest, RejectsPinningMoreThreadsThanCpus) {
  const cpu_set_t mask = AffinityMask();
  EXPECT_THAT(ConfigureCpuThreads(CPU_COUNT(&mask) + 1, /*pin=*/true),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("affinity mask")));
}

TEST(ConfigureCpuThreadsTest, RejectsNegativeCount) {
  EXPECT_THAT(ConfigureCpuThreads(-1, /*pin=*/false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_threads")));
}

}  // namespace
}  // namespace trident::cpu
