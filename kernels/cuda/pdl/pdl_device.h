#ifndef TRIDENT_KERNELS_CUDA_PDL_PDL_DEVICE_H_
#define TRIDENT_KERNELS_CUDA_PDL_PDL_DEVICE_H_

// Programmatic dependent launch (PDL) for the kernels of a decode step, for
// nvcc only (a .cu file's include). A kernel launched with PDL may be
// scheduled as soon as every block of the kernel ahead of it has let its
// dependents launch, instead of when that kernel ends: its launch latency,
// and a projection's first weight loads, then overlap the tail of the
// kernel ahead. A kernel that can be launched so calls
// LetDependentsLaunchThenWait() first: it lets the kernel after it be
// scheduled, then waits until the kernel ahead has ended and its writes are
// visible, before it touches memory. A chain of such kernels keeps the
// order of a plain stream (each waits for the one ahead, which ended only
// after the one ahead of it), and both instructions are no-ops in a plain
// launch.

#include <cuda_runtime.h>

#include <utility>

namespace trident::kernels::cuda::pdl {

__device__ __forceinline__ void LetDependentsLaunch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

__device__ __forceinline__ void WaitForPreviousGrid() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ __forceinline__ void LetDependentsLaunchThenWait() {
  LetDependentsLaunch();
  WaitForPreviousGrid();
}

// Launches `kernel` on `stream` in clusters of `cluster_x` CTAs along x
// (grid.x a multiple of it; 1: no clusters), with programmatic dependent
// launch when `pdl`.
template <typename... Params, typename... Args>
cudaError_t LaunchClustered(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                            cudaStream_t stream, bool pdl, unsigned cluster_x, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  unsigned count = 0;
  if (pdl) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cluster_x > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count].val.clusterDim.x = cluster_x;
    attributes[count].val.clusterDim.y = 1;
    attributes[count].val.clusterDim.z = 1;
    ++count;
  }
  config.attrs = attributes;
  config.numAttrs = count;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Launches `kernel` on `stream`, with programmatic dependent launch when
// `pdl` (a plain launch otherwise).
template <typename... Params, typename... Args>
cudaError_t Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, bool pdl, Args&&... args) {
  return LaunchClustered(kernel, grid, block, shared_bytes, stream, pdl, 1,
                         std::forward<Args>(args)...);
}

}  // namespace trident::kernels::cuda::pdl

#endif  // TRIDENT_KERNELS_CUDA_PDL_PDL_DEVICE_H_
