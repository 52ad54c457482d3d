#ifndef TRIDENT_KERNELS_CUDA_TESTING_PDL_LATE_COPY_H_
#define TRIDENT_KERNELS_CUDA_TESTING_PDL_LATE_COPY_H_

// A kernel for tests of programmatic dependent launch (kernels/cuda/pdl): it
// lets the kernel after it launch at once, waits for the kernel ahead, then
// spins for `delay_ns` before copying `bytes` from `src` to `dst`. A kernel
// launched after it with PDL runs meanwhile; one that reads `dst` before its
// own wait sees the old bytes, so a test can tell whether a kernel reads
// what the kernel ahead writes only after waiting for it.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace trident::kernels::cuda {

// One CTA; `dst` and `src` 16-byte aligned device memory, `bytes` a
// multiple of 16. Launched with PDL when `pdl`.
cudaError_t LaunchPdlLateCopy(void* dst, const void* src, size_t bytes, int64_t delay_ns, bool pdl,
                              cudaStream_t stream);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_TESTING_PDL_LATE_COPY_H_
