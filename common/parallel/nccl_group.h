// A group of this process's GPUs joined by NCCL communicators, one rank per
// device: what tensor parallelism inside one worker sums its partial
// projections over (row-parallel o and down, the vocabulary-split LM head).
//
// One process drives every rank (ncclCommInitAll): a worker's engine and
// scheduler stay single, and a step enqueues each rank's kernels on that
// rank's stream from one thread. AllReduceSum enqueues the collective on
// every rank inside one NCCL group call, so it never blocks the caller on a
// peer; like any kernel launch it only orders work on the streams.

#ifndef TRIDENT_COMMON_PARALLEL_NCCL_GROUP_H_
#define TRIDENT_COMMON_PARALLEL_NCCL_GROUP_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/numeric/dtype.h"

namespace trident::parallel {

class NcclGroup {
 public:
  // One rank per entry of `devices` (CUDA ordinals, distinct), rank r on
  // devices[r]. kInvalidArgument for an empty, repeated or out-of-range
  // list; kFailedPrecondition without CUDA devices; kInternal when NCCL
  // fails to connect them.
  static absl::StatusOr<std::unique_ptr<NcclGroup>> Create(const std::vector<int>& devices);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const { return static_cast<int>(devices_.size()); }
  int device(int rank) const { return devices_[rank]; }

  // Enqueues, for every rank r, buffers[r][0, count) = the sum over ranks of
  // their buffers (in place) on streams[r], a stream of device(r). dtype
  // kF32 or kBF16. kInvalidArgument for spans not of size() entries, a null
  // buffer or another dtype; kInternal when NCCL refuses the call.
  absl::Status AllReduceSum(absl::Span<void* const> buffers, size_t count, numeric::DType dtype,
                            absl::Span<const cudaStream_t> streams);

 private:
  struct Comms;
  NcclGroup(std::vector<int> devices, std::unique_ptr<Comms> comms);

  std::vector<int> devices_;
  std::unique_ptr<Comms> comms_;
};

}  // namespace trident::parallel

#endif  // TRIDENT_COMMON_PARALLEL_NCCL_GROUP_H_
