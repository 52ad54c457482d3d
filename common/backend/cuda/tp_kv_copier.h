// A KvCopier (kv_copier.h) for a tensor-parallel backend's KV: its ranks'
// pools, one per GPU, seen as one pool in the TP = 1 layout
// (model/tensor_parallel/kv_view.h). Ranges are the view's; each maps to
// pieces of the ranks' pools, copied with cudaMemcpyAsync on a stream per
// rank and direction. CopyToHost takes each KV head from the lowest rank
// holding it; CopyFromHost writes every rank holding it. So a KV transport
// moves TP = 1 bytes between workers of any TP degrees, each side's copier
// re-sharding them.

#ifndef TRIDENT_COMMON_BACKEND_CUDA_TP_KV_COPIER_H_
#define TRIDENT_COMMON_BACKEND_CUDA_TP_KV_COPIER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/backend/kv_copier.h"
#include "common/model/tensor_parallel/kv_view.h"

namespace trident::backend {

// Thread-safe (see KvCopier).
class TensorParallelKvCopier final : public KvCopier {
 public:
  // Rank r's pool: `bytes` of device memory at `base` on CUDA device `device`.
  struct RankPool {
    int32_t device = 0;
    char* base = nullptr;
    uint64_t bytes = 0;
  };
  // kInvalidArgument when the pools are not the view's ranks' (count, size);
  // kInternal for CUDA errors.
  static absl::StatusOr<std::unique_ptr<TensorParallelKvCopier>> Create(
      model::KvView view, std::vector<RankPool> ranks);
  ~TensorParallelKvCopier() override;

  absl::StatusOr<std::unique_ptr<HostBuffer>> AllocateHost(size_t size_bytes) override;
  absl::Status CopyToHost(absl::Span<const KvRange> ranges, void* dst) override;
  absl::Status CopyFromHost(const void* src, absl::Span<const KvRange> ranges) override;

 private:
  TensorParallelKvCopier(model::KvView view, std::vector<RankPool> ranks)
      : view_(std::move(view)), ranks_(std::move(ranks)) {}
  // Copies every piece of `ranges` between the host bytes at `host` (back to
  // back) and the ranks' pools on `streams`, then waits for them.
  absl::Status Copy(absl::Span<const KvRange> ranges, char* host, bool to_host,
                    const std::vector<cudaStream_t>& streams);

  const model::KvView view_;
  const std::vector<RankPool> ranks_;
  absl::Mutex to_host_mu_;
  std::vector<cudaStream_t> to_host_ ABSL_GUARDED_BY(to_host_mu_);
  absl::Mutex from_host_mu_;
  std::vector<cudaStream_t> from_host_ ABSL_GUARDED_BY(from_host_mu_);
};

}  // namespace trident::backend

#endif  // TRIDENT_COMMON_BACKEND_CUDA_TP_KV_COPIER_H_
