#ifndef TRIDENT_KERNELS_CUDA_EMBEDDING_EMBEDDING_H_
#define TRIDENT_KERNELS_CUDA_EMBEDDING_EMBEDDING_H_

// Token embedding lookup on the GPU: a row gather from the bf16 table,
//
//   out[t, :] = table[token_ids[t], :]     t in [0, num_tokens)
//
// Token ids live on the device, so the host cannot check them here. An id
// outside [0, vocab) never reads outside the table: its output row is written
// as zeros. Rejecting such ids with a proper error is the host caller's job
// (it sees the ids before copying them to the device; the tokenizer and the
// request validation own that check). The kernel takes raw device pointers and
// a stream, never allocates and never synchronizes.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace trident::kernels::cuda {

struct EmbeddingArgs {
  // Device pointer to num_tokens token ids.
  const int32_t* token_ids = nullptr;
  int64_t num_tokens = 0;
  // Device pointer to the bf16 table, [vocab][hidden], rows contiguous.
  const void* table = nullptr;
  int64_t vocab = 0;
  int64_t hidden = 0;
  // Device pointer to the bf16 output, [num_tokens][hidden], rows contiguous.
  // Must not overlap the table.
  void* out = nullptr;
};

// Enqueues the gather on `stream`. kInvalidArgument for negative num_tokens,
// non-positive vocab or hidden, or null pointers with tokens to process;
// kInternal if the launch fails. Zero tokens is a no-op. Rows move 16 bytes at
// a time when hidden is a multiple of 8 and the pointers are 16-byte aligned,
// 2 bytes at a time otherwise.
absl::Status LaunchEmbedding(const EmbeddingArgs& args, cudaStream_t stream);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_EMBEDDING_EMBEDDING_H_
