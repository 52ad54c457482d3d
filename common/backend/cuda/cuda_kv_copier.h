// A KvCopier for a KV pool in CUDA device memory (kv_copier.h): copies each
// contiguous run with cudaMemcpyAsync on a copy stream of its own (one per
// direction, non-blocking, so a copy never waits for the forward pass's
// stream nor it for a copy), then synchronizes that stream.
//
// CopyFromHost reads memory the copier does not own (a UCX receive buffer,
// pageable), which the driver would stage through its own pinned buffers.
// kPinnedBounce instead copies it in chunks into pinned bounce buffers, each
// chunk's memcpy overlapping the previous chunk's host-to-device copy;
// kPageable hands the pageable source to cudaMemcpyAsync directly. Which is
// faster depends on the host: kv_staging_benchmark measures both. On the
// H200 host (bench/RESULTS.md) kPageable moved 4.5 GB/s end to end against
// 3.8 for kPinnedBounce, so it is the default.

#ifndef TRIDENT_COMMON_BACKEND_CUDA_CUDA_KV_COPIER_H_
#define TRIDENT_COMMON_BACKEND_CUDA_CUDA_KV_COPIER_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/backend/kv_copier.h"
#include "common/backend/model_backend.h"

namespace trident::backend {

struct CudaKvCopierOptions {
  enum class FromHost { kPinnedBounce, kPageable };
  FromHost from_host = FromHost::kPageable;
  // kPinnedBounce: the bounce buffers, `bounce_buffers` of
  // `bounce_buffer_bytes` each (>= 2 to overlap).
  size_t bounce_buffer_bytes = size_t{1} << 20;
  int32_t bounce_buffers = 4;
};

// Thread-safe (see KvCopier).
class CudaKvCopier final : public KvCopier {
 public:
  // For `memory` in device memory (memory.device) on memory.device_ordinal:
  // creates the streams (and for kPinnedBounce the bounce buffers) there.
  // INVALID_ARGUMENT for host memory or bad options; FAILED_PRECONDITION when
  // the device is missing; RESOURCE_EXHAUSTED when pinned memory cannot be
  // had; INTERNAL for other CUDA errors.
  static absl::StatusOr<std::unique_ptr<CudaKvCopier>> Create(const KvMemory& memory,
                                                              CudaKvCopierOptions options = {});
  ~CudaKvCopier() override;

  // cudaHostAlloc'd memory (portable: usable from any device).
  absl::StatusOr<std::unique_ptr<HostBuffer>> AllocateHost(size_t size_bytes) override;
  absl::Status CopyToHost(absl::Span<const KvRange> ranges, void* dst) override;
  absl::Status CopyFromHost(const void* src, absl::Span<const KvRange> ranges) override;

 private:
  struct Direction;
  CudaKvCopier(const KvMemory& memory, const CudaKvCopierOptions& options,
               std::unique_ptr<Direction> to_host, std::unique_ptr<Direction> from_host);

  char* const base_;
  const uint64_t bytes_;
  const int32_t device_;
  const CudaKvCopierOptions options_;
  // Each direction's stream (and bounce buffers); its mutex serializes calls.
  absl::Mutex to_host_mu_;
  const std::unique_ptr<Direction> to_host_ ABSL_PT_GUARDED_BY(to_host_mu_);
  absl::Mutex from_host_mu_;
  const std::unique_ptr<Direction> from_host_ ABSL_PT_GUARDED_BY(from_host_mu_);
};

}  // namespace trident::backend

#endif  // TRIDENT_COMMON_BACKEND_CUDA_CUDA_KV_COPIER_H_
