#ifndef TRIDENT_KERNELS_CUDA_TESTING_READ_CEILING_H_
#define TRIDENT_KERNELS_CUDA_TESTING_READ_CEILING_H_

// A read-only bandwidth probe for the kernel benchmarks: streams
// `bytes` from `data` with 16-byte non-coherent loads and writes nothing
// (except one word to `sink` if the data XOR to a magic value), so its GB/s
// is the ceiling a kernel that only reads (KV, weights) is measured against.

#include <cuda_runtime_api.h>

#include <cstddef>

namespace trident::kernels::cuda {

// `data` 16-byte aligned, `bytes` a multiple of 16; `sink` one device word.
cudaError_t LaunchReadCeiling(const void* data, size_t bytes, unsigned* sink, cudaStream_t stream);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_TESTING_READ_CEILING_H_
