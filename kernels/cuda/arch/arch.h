#ifndef TRIDENT_KERNELS_CUDA_ARCH_ARCH_H_
#define TRIDENT_KERNELS_CUDA_ARCH_ARCH_H_

// Which of the project's architecture-specific kernels the current device can
// run. Hopper's kernels (wgmma, the tensor copy engine) are built for sm_90a
// alone, so their launchers and tests ask this before choosing them.

namespace trident::kernels::cuda {

// Whether the calling thread's current CUDA device is sm_90 (H100, H200).
// False without a device or when the query fails. The answer is kept per
// device after the first call, so launchers may ask on every launch.
bool CurrentDeviceIsSm90();

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_ARCH_ARCH_H_
