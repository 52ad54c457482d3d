#include "kernels/cuda/wgmma/wgmma_probe.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/wgmma/wgmma_probe_kernel.h"

namespace trident::kernels::cuda {

absl::Status LaunchWgmmaProbe(const WgmmaProbeArgs& args, cudaStream_t stream) {
  if (args.a == nullptr || args.b == nullptr || args.d == nullptr) {
    return absl::InvalidArgumentError("wgmma_probe: null pointer");
  }
  if (args.k < 16 || args.k > 128 || args.k % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("wgmma_probe: k is ", args.k, "; want a multiple of 16 in [16, 128]"));
  }
  const cudaError_t error =
      internal::WgmmaProbe(args.a, args.b, args.k, args.d, args.leading_bytes, args.stride_bytes,
                           args.register_a, args.swizzle128, stream);
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("wgmma_probe launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

}  // namespace trident::kernels::cuda
