#include "kernels/cuda/peer_allreduce/peer_allreduce.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/peer_allreduce/peer_allreduce_kernel.h"

namespace trident::kernels::cuda {

size_t PeerAllReduceSignalBytes() { return size_t{internal::kSignalWords} * sizeof(uint32_t); }

absl::Status LaunchPeerAllReduce(const PeerAllReduceArgs& args, cudaStream_t stream) {
  if (args.ranks < 1 || args.ranks > kMaxPeerAllReduceRanks) {
    return absl::InvalidArgumentError(absl::StrCat("peer all-reduce: ranks is ", args.ranks,
                                                   "; want 1..", kMaxPeerAllReduceRanks));
  }
  if (args.rank < 0 || args.rank >= args.ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer all-reduce: rank ", args.rank, " is not in [0, ", args.ranks, ")"));
  }
  if (args.count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer all-reduce: count is ", args.count, "; want >= 0"));
  }
  if (args.timeout_ns <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer all-reduce: timeout_ns is ", args.timeout_ns, "; want > 0"));
  }
  if (args.out == nullptr) return absl::InvalidArgumentError("peer all-reduce: out is null");
  for (int q = 0; q < args.ranks; ++q) {
    if (args.in[q] == nullptr || args.signals[q] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer all-reduce: rank ", q, "'s input or signal area is null"));
    }
    const float* out = args.out;
    if (out < args.in[q] + args.count && args.in[q] < out + args.count) {
      return absl::InvalidArgumentError(
          absl::StrCat("peer all-reduce: out overlaps rank ", q,
                       "'s input (peers read it while it is written)"));
    }
  }
  // A zero count still runs both barriers: the epochs stay in step.
  const cudaError_t error = internal::PeerAllReduce(args, stream);
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("peer all-reduce launch: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> PeerAllReduceFailed(const void* signal_area) {
  uint32_t word = 0;
  const cudaError_t error =
      cudaMemcpy(&word, static_cast<const uint32_t*>(signal_area) + internal::kErrorOffset,
                 sizeof(word), cudaMemcpyDeviceToHost);
  if (error != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("peer all-reduce error word: ", cudaGetErrorString(error)));
  }
  return word != 0;
}

void SumInRankOrder(const float* const* in, int ranks, int64_t count, float* out, bool accumulate) {
  for (int64_t i = 0; i < count; ++i) {
    float acc = in[0][i];
    for (int q = 1; q < ranks; ++q) acc += in[q][i];
    out[i] = accumulate ? out[i] + acc : acc;
  }
}

}  // namespace trident::kernels::cuda
