#include "kernels/cuda/embedding/embedding.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/embedding/embedding_kernel.h"

namespace trident::kernels::cuda {

absl::Status LaunchEmbedding(const EmbeddingArgs& args, cudaStream_t stream) {
  if (args.num_tokens < 0 || args.vocab <= 0 || args.hidden <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("embedding: num_tokens ", args.num_tokens,
                                                   ", vocab ", args.vocab, " and hidden ",
                                                   args.hidden, " must be >= 0, > 0 and > 0"));
  }
  if (args.num_tokens > 0x7fffffff) {
    return absl::InvalidArgumentError("embedding: more than 2^31 - 1 tokens");
  }
  if (args.num_tokens > 0 &&
      (args.token_ids == nullptr || args.table == nullptr || args.out == nullptr)) {
    return absl::InvalidArgumentError(
        "embedding: null token_ids, table or out with tokens to process");
  }
  const bool vectorized = args.hidden % 8 == 0 &&
                          reinterpret_cast<uintptr_t>(args.table) % 16 == 0 &&
                          reinterpret_cast<uintptr_t>(args.out) % 16 == 0;
  const cudaError_t error =
      internal::EmbeddingBf16(args.token_ids, args.num_tokens, args.table, args.vocab, args.hidden,
                              args.out, vectorized, stream);
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("embedding launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

}  // namespace trident::kernels::cuda
