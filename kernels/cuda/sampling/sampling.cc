#include "kernels/cuda/sampling/sampling.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/sampling/sampling_kernel.h"

namespace trident::kernels::cuda {
namespace {

absl::Status Invalid(const char* field, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("sample: ", field, " ", problem));
}

}  // namespace

size_t SampleWorkspaceBytes(int64_t rows, int32_t vocab) {
  if (rows <= 0 || vocab <= 0) return 0;
  return static_cast<size_t>(rows) *
         static_cast<size_t>(internal::SampleWorkspaceRowFloats(vocab)) * sizeof(float);
}

absl::Status LaunchSample(const SampleArgs& args, cudaStream_t stream) {
  if (args.rows < 0 || args.rows > 0x7fffffff) {
    return Invalid("rows", absl::StrCat("is ", args.rows, "; want 0 <= rows < 2^31"));
  }
  if (args.vocab <= 0 || args.vocab > kMaxSampleVocab) {
    return Invalid("vocab", absl::StrCat("is ", args.vocab, "; want 1..", kMaxSampleVocab));
  }
  if (args.logits_stride < args.vocab) {
    return Invalid("logits_stride",
                   absl::StrCat("is ", args.logits_stride, "; want >= vocab (", args.vocab, ")"));
  }
  if (args.logits_dtype != numeric::DType::kF32 && args.logits_dtype != numeric::DType::kBF16) {
    return Invalid("logits_dtype", absl::StrCat("is ", numeric::DTypeName(args.logits_dtype),
                                                "; want f32 or bf16"));
  }
  if (args.max_top_logprobs < 0 || args.max_top_logprobs > kMaxSampleTopLogprobs) {
    return Invalid("max_top_logprobs",
                   absl::StrCat("is ", args.max_top_logprobs, "; want 0..", kMaxSampleTopLogprobs));
  }
  if (args.rows == 0) return absl::OkStatus();
  if (args.logits == nullptr) return Invalid("logits", "is null");
  if (args.params == nullptr) return Invalid("params", "is null");
  if (args.tokens == nullptr) return Invalid("tokens", "is null");
  if (args.max_top_logprobs > 0 && args.top_ids == nullptr) {
    return Invalid("top_ids", "is null with max_top_logprobs > 0");
  }
  if (args.max_top_logprobs > 0 && args.top_logprobs == nullptr) {
    return Invalid("top_logprobs", "is null with max_top_logprobs > 0");
  }
  if (args.workspace == nullptr) return Invalid("workspace", "is null");
  if (reinterpret_cast<uintptr_t>(args.workspace) % 16 != 0) {
    return Invalid("workspace", "is not 16-byte aligned");
  }
  const size_t needed = SampleWorkspaceBytes(args.rows, args.vocab);
  if (args.workspace_bytes < needed) {
    return Invalid("workspace_bytes",
                   absl::StrCat("is ", args.workspace_bytes, "; want >= ", needed,
                                " (SampleWorkspaceBytes(", args.rows, ", ", args.vocab, "))"));
  }
  const internal::SampleKernelArgs kernel_args{
      .logits = args.logits,
      .logits_bf16 = args.logits_dtype == numeric::DType::kBF16,
      .logits_stride = args.logits_stride,
      .vocab = args.vocab,
      .params = args.params,
      .seen_tokens = args.seen_tokens,
      .output_counts = args.output_counts,
      .tokens = args.tokens,
      .logprobs = args.logprobs,
      .max_top_logprobs = args.max_top_logprobs,
      .top_ids = args.top_ids,
      .top_logprobs = args.top_logprobs,
      .workspace = static_cast<float*>(args.workspace),
      .greedy_only = args.greedy_only && args.max_top_logprobs == 0,
  };
  const cudaError_t error = internal::Sample(kernel_args, args.rows, stream);
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("sample launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

}  // namespace trident::kernels::cuda
