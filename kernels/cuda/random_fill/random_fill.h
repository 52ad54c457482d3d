// Generated weights computed where they are loaded: fills a device buffer
// with a counter-based stream's block (common/numeric/counter_stream.h),
// rounded to bf16, bit for bit what model/generate's RandomWeights reads for
// the same block on the host (the reference). A benchmark's or test's
// loader of a large preset (a 70B rank's 35 GB shard) then spends
// milliseconds instead of minutes of host cores and a host-to-device copy.

#ifndef TRIDENT_KERNELS_CUDA_RANDOM_FILL_RANDOM_FILL_H_
#define TRIDENT_KERNELS_CUDA_RANDOM_FILL_RANDOM_FILL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/numeric/counter_stream.h"

namespace trident::kernels::cuda {

struct RandomFillArgs {
  // The block; its quarter_rows are read from `quarter_rows` instead.
  const numeric::CounterStreamBlock* block = nullptr;
  // Device pointer to block->rows flags (nonzero: the row is scaled by
  // 0.25), or null when block->quarter_rows is empty.
  const uint8_t* quarter_rows = nullptr;
  // Device pointer to block->rows * block->cols bf16 elements, row-major.
  uint16_t* out = nullptr;
};

// Enqueues the fill on `stream`; never allocates or synchronizes.
// kInvalidArgument for a null block or output, negative sizes, a block
// outside its tensor (col0 + cols > tensor_cols), or quarter_rows null
// while the block's are not empty (or set while they are). An empty block is
// a no-op.
absl::Status LaunchRandomFillBf16(const RandomFillArgs& args, cudaStream_t stream);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_RANDOM_FILL_RANDOM_FILL_H_
