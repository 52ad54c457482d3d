#include "kernels/cuda/pdl/pdl_chain.h"
#include "kernels/cuda/pdl/pdl_device.h"

namespace trident::kernels::cuda {
namespace {

__global__ void ChainStepKernel(unsigned* counter) {
  pdl::LetDependentsLaunchThenWait();
  if (blockIdx.x == 0 && threadIdx.x == 0) *counter += 1;
}

}  // namespace

cudaError_t LaunchChainStep(unsigned* counter, int blocks, bool pdl, cudaStream_t stream) {
  return pdl::Launch(&ChainStepKernel, dim3(blocks), dim3(128), 0, stream, pdl, counter);
}

}  // namespace trident::kernels::cuda
