#include "kernels/cuda/rms_norm/rms_norm.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/rms_norm/rms_norm_kernel.h"

namespace trident::kernels::cuda {
namespace {

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

absl::Status CheckShape(const char* op, int64_t rows, int64_t dim, float eps) {
  if (rows < 0 || rows > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": rows is ", rows, "; want 0 <= rows < 2^31"));
  }
  if (dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": dim is ", dim, "; want > 0"));
  }
  if (!(eps >= 0.0f) || !std::isfinite(eps)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": eps is ", eps, "; want finite and >= 0"));
  }
  return absl::OkStatus();
}

absl::Status CheckStride(const char* op, const char* field, int64_t stride, int64_t dim) {
  if (stride < dim) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", field, " is ", stride, "; want >= dim (", dim, ")"));
  }
  return absl::OkStatus();
}

absl::Status LaunchStatus(const char* op, cudaError_t error) {
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat(op, " launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchRmsNorm(const RmsNormArgs& args, cudaStream_t stream) {
  constexpr char kOp[] = "rms_norm";
  if (absl::Status s = CheckShape(kOp, args.rows, args.dim, args.eps); !s.ok()) return s;
  if (args.x_dtype != numeric::DType::kF32 && args.x_dtype != numeric::DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": x_dtype is ", numeric::DTypeName(args.x_dtype), "; want f32 or bf16"));
  }
  if (absl::Status s = CheckStride(kOp, "x_stride", args.x_stride, args.dim); !s.ok()) return s;
  if (absl::Status s = CheckStride(kOp, "out_stride", args.out_stride, args.dim); !s.ok()) {
    return s;
  }
  if (args.rows > 0 && (args.x == nullptr || args.weight == nullptr || args.out == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": null x, weight or out with rows to process"));
  }
  const bool x_is_bf16 = args.x_dtype == numeric::DType::kBF16;
  const bool vectorized = args.dim % 4 == 0 && args.x_stride % 4 == 0 && args.out_stride % 4 == 0 &&
                          Aligned(args.x, x_is_bf16 ? 8 : 16) && Aligned(args.weight, 16) &&
                          Aligned(args.out, 8);
  return LaunchStatus(kOp, internal::RmsNormBf16Out(args.x, x_is_bf16, args.x_stride, args.weight,
                                                    args.out, args.out_stride, args.rows, args.dim,
                                                    args.eps, vectorized, args.pdl, stream));
}

absl::Status LaunchAddRmsNorm(const AddRmsNormArgs& args, cudaStream_t stream) {
  constexpr char kOp[] = "add_rms_norm";
  if (absl::Status s = CheckShape(kOp, args.rows, args.dim, args.eps); !s.ok()) return s;
  if (absl::Status s = CheckStride(kOp, "residual_stride", args.residual_stride, args.dim);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckStride(kOp, "delta_stride", args.delta_stride, args.dim); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckStride(kOp, "out_stride", args.out_stride, args.dim); !s.ok()) {
    return s;
  }
  if (args.rows > 0 && (args.residual == nullptr || args.delta == nullptr ||
                        args.weight == nullptr || args.out == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": null residual, delta, weight or out with rows to process"));
  }
  const bool vectorized = args.dim % 4 == 0 && args.residual_stride % 4 == 0 &&
                          args.delta_stride % 4 == 0 && args.out_stride % 4 == 0 &&
                          Aligned(args.residual, 16) && Aligned(args.delta, 8) &&
                          Aligned(args.weight, 16) && Aligned(args.out, 8);
  return LaunchStatus(kOp, internal::AddRmsNormBf16Out(
                               args.residual, args.residual_stride, args.delta, args.delta_stride,
                               args.replace_residual, args.weight, args.out, args.out_stride,
                               args.rows, args.dim, args.eps, vectorized, args.pdl, stream));
}

}  // namespace trident::kernels::cuda
