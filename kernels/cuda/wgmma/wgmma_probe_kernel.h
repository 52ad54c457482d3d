#ifndef TRIDENT_KERNELS_CUDA_WGMMA_WGMMA_PROBE_KERNEL_H_
#define TRIDENT_KERNELS_CUDA_WGMMA_WGMMA_PROBE_KERNEL_H_

// The launcher nvcc compiles; wgmma_probe.cc checks arguments first.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trident::kernels::cuda::internal {

cudaError_t WgmmaProbe(const uint16_t* a, const uint16_t* b, int32_t k, float* d,
                       uint32_t leading_bytes, uint32_t stride_bytes, bool register_a, bool swizzle,
                       cudaStream_t stream);

}  // namespace trident::kernels::cuda::internal

#endif  // TRIDENT_KERNELS_CUDA_WGMMA_WGMMA_PROBE_KERNEL_H_
