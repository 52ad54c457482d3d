#include "common/cpu/cpu_features.h"

#include <sched.h>

#include "gtest/gtest.h"

namespace trident::cpu {
namespace {

TEST(CpuFeaturesTest, AgreesWithTheCompilersCpuDetection) {
  const CpuFeatures& features = GetCpuFeatures();
  __builtin_cpu_init();
  EXPECT_EQ(features.avx2, static_cast<bool>(__builtin_cpu_supports("avx2")));
  EXPECT_EQ(features.fma, static_cast<bool>(__builtin_cpu_supports("fma")));
  EXPECT_EQ(features.f16c, static_cast<bool>(__builtin_cpu_supports("f16c")));
  EXPECT_EQ(features.avx512f, static_cast<bool>(__builtin_cpu_supports("avx512f")));
  // Every bf16 or AMX machine has AVX-512.
  if (features.avx512_bf16 || features.amx_bf16) {
    EXPECT_TRUE(features.avx512f);
  }
  if (features.amx_bf16) {
    EXPECT_TRUE(features.amx_tile);
  }
  if (features.avx512f) {
    EXPECT_TRUE(features.avx2);
  }
}

TEST(CpuFeaturesTest, CoreCountsAreConsistentWithTheAffinityMask) {
  const CpuFeatures& features = GetCpuFeatures();
  cpu_set_t mask;
  CPU_ZERO(&mask);
  ASSERT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  EXPECT_GE(features.physical_cores, 1);
  EXPECT_LE(features.physical_cores, features.logical_cpus);
  EXPECT_GE(features.logical_cpus, CPU_COUNT(&mask));
}

TEST(CpuFeaturesTest, ReturnsTheSameObjectEveryTime) {
  EXPECT_EQ(&GetCpuFeatures(), &GetCpuFeatures());
}

TEST(CpuFeaturesTest, StringNamesTheCounts) {
  CpuFeatures features;
  features.avx2 = true;
  features.fma = true;
  features.physical_cores = 4;
  features.logical_cpus = 8;
  EXPECT_EQ(CpuFeaturesString(features), "avx2 fma; 4 physical cores, 8 logical CPUs");
}

}  // namespace
}  // namespace trident::cpu
