#ifndef TRIDENT_KERNELS_CUDA_ARCH_SHARED_MEMORY_H_
#define TRIDENT_KERNELS_CUDA_ARCH_SHARED_MEMORY_H_

// Opting a kernel into more than 48 KiB of dynamic shared memory, once per
// device instead of on every launch: the attribute calls cost host time on
// each eager launch, and tensor-parallel ranks drive several devices from
// one process, so the record is per device.

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

namespace trident::kernels::cuda {

// Sets `kernel`'s maximum dynamic shared memory to `bytes`, with shared
// memory preferred over L1, unless `configured` already records the calling
// thread's current device (bit d for device d < 64; devices past 63 are
// configured on every call). `configured` belongs to the kernel: a static of
// its launcher. Thread-safe. Returns the CUDA error of a failed call, and
// records nothing then.
template <typename Kernel>
cudaError_t ConfigureSharedMemoryOnce(Kernel kernel, int64_t bytes,
                                      std::atomic<uint64_t>& configured) {
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return error;
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (configured.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(bytes));
  if (error != cudaSuccess) return error;
  // The kernels that ask stream their operands through shared memory, so the
  // CTAs that fit by shared memory are resident together.
  error = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
  if (error != cudaSuccess) return error;
  configured.fetch_or(bit, std::memory_order_release);
  return cudaSuccess;
}

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_ARCH_SHARED_MEMORY_H_
