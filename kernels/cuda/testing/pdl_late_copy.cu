#include <cuda_runtime.h>

#include "kernels/cuda/pdl/pdl_device.h"
#include "kernels/cuda/testing/pdl_late_copy.h"

namespace trident::kernels::cuda {
namespace {

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void PdlLateCopyKernel(uint4* dst, const uint4* src, size_t pieces, int64_t delay_ns) {
  pdl::LetDependentsLaunchThenWait();
  if (threadIdx.x == 0) {
    const uint64_t until = GlobalTimerNs() + static_cast<uint64_t>(delay_ns);
    while (GlobalTimerNs() < until) __nanosleep(1000);
  }
  __syncthreads();
  for (size_t i = threadIdx.x; i < pieces; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

cudaError_t LaunchPdlLateCopy(void* dst, const void* src, size_t bytes, int64_t delay_ns, bool pdl,
                              cudaStream_t stream) {
  return pdl::Launch(&PdlLateCopyKernel, dim3(1), dim3(256), 0, stream, pdl,
                     static_cast<uint4*>(dst), static_cast<const uint4*>(src), bytes / 16,
                     delay_ns);
}

}  // namespace trident::kernels::cuda
