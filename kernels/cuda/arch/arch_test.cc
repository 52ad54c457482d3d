// CurrentDeviceIsSm90 against the CUDA runtime's own answer, on whatever
// machine runs the test (no device: false).

#include "kernels/cuda/arch/arch.h"

#include <cuda_runtime_api.h>

#include <cstdio>

#include "gtest/gtest.h"

namespace trident::kernels::cuda {
namespace {

bool AskTheRuntime() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return false;
  int device = 0;
  int major = 0;
  int minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    return false;
  }
  return major == 9 && minor == 0;
}

TEST(ArchTest, MatchesTheRuntimeAndKeepsItsAnswer) {
  const bool want = AskTheRuntime();
  std::printf("current device is sm_90: %s\n", want ? "yes" : "no");
  EXPECT_EQ(CurrentDeviceIsSm90(), want);
  EXPECT_EQ(CurrentDeviceIsSm90(), want);  // From the kept answer.
}

}  // namespace
}  // namespace trident::kernels::cuda
