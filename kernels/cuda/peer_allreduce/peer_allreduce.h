// A one-shot all-reduce (sum) of f32 vectors over up to 8 GPUs that can
// address each other's memory (one process with peer access enabled): each
// rank's kernel reads every rank's input over NVLink and writes the sum to
// its own output, between two barriers kept in flag words in each rank's
// memory. For the small vectors a tensor-parallel decode step sums (a
// token's hidden row, 16-32 KiB), one kernel's latency instead of a ring's
// several steps. Every rank adds the inputs in rank order, so all outputs
// are bit-identical, and equal the CPU reference's (SumInRankOrder).
//
// Launch it on every rank (each on a stream of its own device) with the
// same `count`, after each rank's input is written on that stream; a rank
// that never launches leaves its peers waiting until timeout_ns (10 s),
// after which they give up, leave their output unspecified and raise their
// signal area's error word (PeerAllReduceFailed; the areas are then zeroed
// again before the next call). The epoch counters live in
// device memory, so the calls may be captured in CUDA graphs and replayed.

#ifndef TRIDENT_KERNELS_CUDA_PEER_ALLREDUCE_PEER_ALLREDUCE_H_
#define TRIDENT_KERNELS_CUDA_PEER_ALLREDUCE_PEER_ALLREDUCE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trident::kernels::cuda {

inline constexpr int kMaxPeerAllReduceRanks = 8;
inline constexpr int64_t kPeerAllReduceTimeoutNs = int64_t{10} * 1000 * 1000 * 1000;

// Bytes of one rank's signal area, which its owner zeroes once before the
// first call (and never while calls are in flight).
size_t PeerAllReduceSignalBytes();

struct PeerAllReduceArgs {
  int rank = 0;
  int ranks = 0;
  // Every rank's input [count] and signal area, indexed by rank; readable
  // and writable from this rank's device. out [count] is this rank's and
  // aliases no input (peers read the inputs while it is written).
  const float* in[kMaxPeerAllReduceRanks] = {};
  void* signals[kMaxPeerAllReduceRanks] = {};
  float* out = nullptr;
  int64_t count = 0;
  // out[i] += the sum instead of out[i] = the sum (a tensor-parallel
  // step's residual stream taking the ranks' partial projections).
  bool accumulate = false;
  // Skip the closing barrier (every rank done reading the inputs): one
  // barrier's latency less. Only when no rank writes this call's input
  // again before its next call has started on every rank, e.g. each rank
  // alternating between two input buffers from call to call (passing the
  // next call's opening barrier means every peer finished this one).
  bool skip_end_barrier = false;
  // How long a rank waits for a silent peer before giving up.
  int64_t timeout_ns = kPeerAllReduceTimeoutNs;
};

// Enqueues this rank's part. kInvalidArgument for a rank outside [0,
// ranks), ranks outside [1, kMaxPeerAllReduceRanks], a negative count, a
// null pointer among the first `ranks`, or out aliasing an input.
absl::Status LaunchPeerAllReduce(const PeerAllReduceArgs& args, cudaStream_t stream);

// Whether a call on the rank owning `signal_area` (a device pointer) timed
// out waiting for a peer since the area was zeroed. Synchronous read.
absl::StatusOr<bool> PeerAllReduceFailed(const void* signal_area);

// The CPU reference: out[i] = in[0][i] + in[1][i] + ... in rank order;
// with `accumulate`, out[i] += that sum.
void SumInRankOrder(const float* const* in, int ranks, int64_t count, float* out,
                    bool accumulate = false);

}  // namespace trident::kernels::cuda

#endif  // TRIDENT_KERNELS_CUDA_PEER_ALLREDUCE_PEER_ALLREDUCE_H_
