#include "kernels/cuda/arch/arch.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

namespace trident::kernels::cuda {

bool CurrentDeviceIsSm90() {
  constexpr int kMaxDevices = 64;
  // Per device: 0 not asked yet, 1 sm_90, 2 not.
  static std::atomic<uint8_t> known[kMaxDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    const uint8_t seen = known[device].load(std::memory_order_relaxed);
    if (seen != 0) return seen == 1;
  }
  int major = 0;
  int minor = 0;
  const bool sm90 =
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
      major == 9 && minor == 0;
  if (cached) known[device].store(sm90 ? 1 : 2, std::memory_order_relaxed);
  return sm90;
}

}  // namespace trident::kernels::cuda
