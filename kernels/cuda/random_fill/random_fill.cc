#include "kernels/cuda/random_fill/random_fill.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/random_fill/random_fill_kernel.h"

namespace trident::kernels::cuda {
namespace {

absl::Status Invalid(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("random_fill: ", what));
}

absl::Status CheckBlock(const RandomFillArgs& args) {
  if (args.block == nullptr) return Invalid("no block");
  const numeric::CounterStreamBlock& b = *args.block;
  if (b.rows < 0 || b.cols < 0 || b.row0 < 0 || b.col0 < 0 || b.tensor_cols <= 0) {
    return Invalid(absl::StrCat("block of ", b.rows, " x ", b.cols, " at (", b.row0, ", ", b.col0,
                                ") of a tensor of ", b.tensor_cols,
                                " columns; want sizes and offsets >= 0 and columns > 0"));
  }
  if (b.col0 + b.cols > b.tensor_cols) {
    return Invalid(absl::StrCat("columns [", b.col0, ", ", b.col0 + b.cols,
                                ") outside the tensor's ", b.tensor_cols));
  }
  if (b.quarter_rows.empty() != (args.quarter_rows == nullptr)) {
    return Invalid(absl::StrCat("the block has ", b.quarter_rows.size(),
                                " row flags; the device copy is ",
                                args.quarter_rows == nullptr ? "null" : "set"));
  }
  if (!b.quarter_rows.empty() && static_cast<int64_t>(b.quarter_rows.size()) != b.rows) {
    return Invalid(absl::StrCat(b.quarter_rows.size(), " row flags for ", b.rows, " rows"));
  }
  if (b.rows * b.cols > 0 && args.out == nullptr) return Invalid("no output");
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchRandomFillBf16(const RandomFillArgs& args, cudaStream_t stream) {
  if (absl::Status s = CheckBlock(args); !s.ok()) return s;
  const numeric::CounterStreamBlock& b = *args.block;
  if (b.rows * b.cols == 0) return absl::OkStatus();
  const internal::RandomFillParams params{b.base, b.mean, b.half_width, b.tensor_cols,
                                          b.row0, b.col0, b.rows,       b.cols};
  const cudaError_t error = internal::RandomFillBf16(params, args.quarter_rows, args.out, stream);
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("random_fill launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

}  // namespace trident::kernels::cuda
