// A probe of kernels/cuda/wgmma's encoding (testonly): one warpgroup stores
// A and B in the no-swizzle K-major layout and computes D = A B^T with
// m64n64k16 wgmma steps (or A B with A in registers and B MN-major), so
// that a test compares the descriptors, the
// fences and the accumulator fragment against a CPU product.

#ifndef TRIDENT_KERNELS_CUDA_WGMMA_WGMMA_PROBE_H_
#define TRIDENT_KERNELS_CUDA_WGMMA_WGMMA_PROBE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace trident::kernels::cuda {

struct WgmmaProbeArgs {
  // Device pointers: A and B 64 x k bf16, row-major (K contiguous); D 64 x
  // 64 f32, row-major.
  const uint16_t* a = nullptr;
  const uint16_t* b = nullptr;
  int32_t k = 16;  // A multiple of 16 up to 128.
  float* d = nullptr;
  // The descriptor's offsets for the probe's layout, in which core matrices
  // adjacent along K are 128 bytes apart and along M (N) 256 bytes apart.
  // Swapped, the test learns which field is which.
  uint32_t leading_bytes = 128;
  uint32_t stride_bytes = 256;
  // D = A B instead, A from registers (the fragment wgmma_device documents)
  // and b k x 64 row-major (N contiguous), stored MN-major with the same
  // offsets: the P.V product of attention.
  bool register_a = false;
  // The 128-byte-swizzled layouts instead (wgmma_device's
  // Swizzle128Descriptor, stride_bytes between 8-row atoms, leading_bytes
  // unused).
  bool swizzle128 = false;
};

// kInvalidArgument for null pointers or k outside [16, 128] or not a
// multiple of 16; kInternal if the launch fails.
absl::Status LaunchWgmmaProbe(const WgmmaProbeArgs& args, cudaStream_t stream);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_WGMMA_WGMMA_PROBE_H_
