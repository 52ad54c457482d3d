#ifndef TRIDENT_KERNELS_CUDA_PDL_PDL_CHAIN_H_
#define TRIDENT_KERNELS_CUDA_PDL_PDL_CHAIN_H_

// One step of a chain of empty dependent kernels, for pdl_chain_benchmark:
// what each kernel of a decode step costs beyond its own work when it must
// wait for the one ahead to end. Each step lets its dependents launch, waits
// for the kernel ahead, and adds 1 to *counter (one thread), so a chain of N
// steps leaves N more there only if the order held.

#include <cuda_runtime_api.h>

namespace trident::kernels::cuda {

// `blocks` CTAs of 128 threads, with programmatic dependent launch when
// `pdl`. Returns the launch's error.
cudaError_t LaunchChainStep(unsigned* counter, int blocks, bool pdl, cudaStream_t stream);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_PDL_PDL_CHAIN_H_
