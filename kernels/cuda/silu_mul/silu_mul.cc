#include "kernels/cuda/silu_mul/silu_mul.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/silu_mul/silu_mul_kernel.h"

namespace trident::kernels::cuda {

absl::Status LaunchSiluMul(const SiluMulArgs& args, cudaStream_t stream) {
  if (args.num_tokens < 0 || args.hidden <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("silu_mul: num_tokens ", args.num_tokens,
                                                   " and hidden ", args.hidden,
                                                   " must be >= 0 and > 0"));
  }
  if (args.hidden % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("silu_mul: hidden ", args.hidden, " must be even"));
  }
  if (args.gate_up_stride < 2 * args.hidden || args.gate_up_stride % 2 != 0 ||
      args.out_stride < args.hidden || args.out_stride % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("silu_mul: strides (gate_up ", args.gate_up_stride, ", out ", args.out_stride,
                     ") must be even and hold a row (", 2 * args.hidden, ", ", args.hidden, ")"));
  }
  if (args.num_tokens > 0 && (args.gate_up == nullptr || args.out == nullptr)) {
    return absl::InvalidArgumentError("silu_mul: null pointer with rows to process");
  }
  if (args.num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError("silu_mul: more than 2^31 - 1 tokens");
  }
  if (args.gate_up_dtype != numeric::DType::kBF16 && args.gate_up_dtype != numeric::DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat("silu_mul: gate_up dtype ",
                                                   numeric::DTypeName(args.gate_up_dtype),
                                                   " is not supported (bf16 or f32)"));
  }
  const cudaError_t error = internal::SiluMulBf16(
      args.gate_up, args.gate_up_stride, args.gate_up_dtype == numeric::DType::kF32, args.out,
      args.out_stride, args.num_tokens, args.hidden, args.pdl, stream);
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("silu_mul launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

}  // namespace trident::kernels::cuda
