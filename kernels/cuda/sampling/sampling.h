#ifndef TRIDENT_KERNELS_CUDA_SAMPLING_SAMPLING_H_
#define TRIDENT_KERNELS_CUDA_SAMPLING_SAMPLING_H_

// The GPU sampler: one launch turns a batch of logit rows into one token per
// row, with exactly the semantics of the CPU sampler (common/sampling/
// sampler.h, whose pipeline comment is the spec): penalties, greedy argmax
// (lowest id on ties), temperature, top_k (ties to lower ids), top_p (sorted
// by weight descending, ties lower id first, keep while the preceding mass is
// < top_p * total), min_p, then the Philox draw u = UniformFromPhilox(seed,
// output_position) walked over the kept tokens in ascending id order. NaN
// logits count as -inf; a row whose logits are all -inf samples token 0.
// Logprobs are log_softmax of the raw logits (before penalties); top
// logprobs list the n most likely raw tokens, most likely first, ties lower
// id first.
//
// Where it can differ from the CPU: weights come from the GPU's expf (within
// 2 ulp of the CPU's std::exp) and masses are summed exactly in 64-bit fixed
// point (weight * 2^s truncated, s = 62 - ceil(log2(vocab))) instead of
// sequential doubles. So a row whose draw u * total lies within rounding of
// a cumulative boundary (or whose top_p / top_k cut sits on a near-tie) can
// pick a neighbouring token; everything else is bit-for-bit the CPU's
// choice. Integer sums also make the result deterministic: the same inputs
// give the same tokens on every launch.
//
// One thread block (1024 threads) per row; the kernel takes raw device
// pointers and a stream, never allocates and never synchronizes.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/numeric/dtype.h"
#include "kernels/cuda/sampling/sampling_row.h"

namespace trident::kernels::cuda {

// Most top logprobs a row can ask for (trident::sampling::kMaxTopLogprobs).
inline constexpr int32_t kMaxSampleTopLogprobs = 20;
// Largest vocabulary a launch accepts (the penalty bitmap lives in shared
// memory: vocab / 8 bytes).
inline constexpr int32_t kMaxSampleVocab = 1 << 20;

struct SampleArgs {
  // Device pointer to `rows` rows of `vocab` logits of logits_dtype (kF32 or
  // kBF16), row stride logits_stride elements (>= vocab). Not modified.
  const void* logits = nullptr;
  numeric::DType logits_dtype = numeric::DType::kF32;
  int64_t logits_stride = 0;
  int64_t rows = 0;
  int32_t vocab = 0;

  // Device array of `rows` SamplingRow. REQUIRES (not checkable on the host):
  // each row's parameters are valid (SamplingParamsFromProto's ranges), its
  // CSR ranges lie inside the arrays below, and the tokens within one row's
  // seen range, and within one row's counts range, are distinct (PenaltyState
  // guarantees both). Ids outside [0, vocab) are ignored, as on the CPU.
  const SamplingRow* params = nullptr;
  // Device CSR arrays the rows' ranges index. May be null when every row's
  // range is empty (then penalties are skipped).
  const int32_t* seen_tokens = nullptr;
  const SamplingTokenCount* output_counts = nullptr;

  // Outputs (device). tokens: [rows]. logprobs: [rows], the sampled token's
  // logprob, 0 for rows that ask for neither logprobs nor top logprobs; may be
  // null when no row asks. top_ids / top_logprobs: [rows][max_top_logprobs];
  // row r's first min(top_logprobs, max_top_logprobs, vocab) slots hold its
  // most likely tokens, the rest id -1 and logprob -inf. May be null when
  // max_top_logprobs is 0.
  int32_t* tokens = nullptr;
  float* logprobs = nullptr;
  int32_t max_top_logprobs = 0;
  int32_t* top_ids = nullptr;
  float* top_logprobs = nullptr;

  // Device scratch of at least SampleWorkspaceBytes(rows, vocab) bytes,
  // 16-byte aligned; its contents on entry do not matter. Must not be used
  // by anything else until the launch completes.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  // The caller's promise that every row is greedy (temperature 0) with no
  // penalty in effect and no logprobs (max_top_logprobs 0): the rows then
  // take an argmax over several SMs each instead of the one-block sampler,
  // with the same tokens (logprobs, when given, get 0 as for rows that do
  // not ask). Rows that break the promise get the argmax all the same.
  bool greedy_only = false;
};

// Workspace bytes a launch with `rows` rows of `vocab` logits needs (one fp32
// weight per logit). 0 for non-positive sizes.
size_t SampleWorkspaceBytes(int64_t rows, int32_t vocab);

// Enqueues the sampler on `stream` and returns without waiting. Returns
// kInvalidArgument, naming the field, for rows < 0 or >= 2^31, vocab not in
// [1, kMaxSampleVocab], logits_stride < vocab, a logits_dtype other than f32
// or bf16, max_top_logprobs not in [0, kMaxSampleTopLogprobs], a null logits,
// params, tokens or workspace pointer with rows to process, null top outputs
// with max_top_logprobs > 0, or a workspace that is smaller than
// SampleWorkspaceBytes or misaligned; kInternal if the launch fails. Zero rows
// is a no-op.
absl::Status LaunchSample(const SampleArgs& args, cudaStream_t stream);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_SAMPLING_SAMPLING_H_
