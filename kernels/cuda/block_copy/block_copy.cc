#include "kernels/cuda/block_copy/block_copy.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/block_copy/block_copy_kernel.h"

namespace trident::kernels::cuda {

absl::Status LaunchBlockCopy(const BlockCopyArgs& args, cudaStream_t stream) {
  if (args.num_blocks < 0 || args.num_blocks > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("block copy: num_blocks is ", args.num_blocks, "; want 0 <= n < 2^31"));
  }
  if (args.block_bytes <= 0 || args.block_bytes % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("block copy: block_bytes is ", args.block_bytes,
                                                   "; want a positive multiple of 16"));
  }
  if (args.num_blocks == 0) return absl::OkStatus();
  if (args.src == nullptr || args.dst == nullptr) {
    return absl::InvalidArgumentError("block copy: src and dst pointer arrays must not be null");
  }
  const cudaError_t error =
      internal::BlockCopy(args.src, args.dst, args.num_blocks, args.block_bytes, stream);
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("block copy launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

}  // namespace trident::kernels::cuda
