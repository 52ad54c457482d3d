#ifndef TRIDENT_KERNELS_CUDA_TESTING_DEVICE_ARCH_H_
#define TRIDENT_KERNELS_CUDA_TESTING_DEVICE_ARCH_H_

// Which kernels a test's device can run: tests of Hopper-only kernels (sm_90a
// builds: wgmma, the tensor copy engine) run them only on such a device.

#include <cuda_runtime_api.h>

namespace trident::kernels::cuda::testing {

// Whether device 0 is an sm_90 GPU (H100, H200); false without a device.
inline bool IsSm90Device() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return false;
  int major = 0;
  int minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
    return false;
  }
  return major == 9 && minor == 0;
}

}  // namespace trident::kernels::cuda::testing

#endif  // TRIDENT_KERNELS_CUDA_TESTING_DEVICE_ARCH_H_
