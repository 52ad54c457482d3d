// A KvCopier for a KV pool in host memory: plain memcpy. Host backends need
// no staging (UCX reads and writes their pool directly); this one lets the
// staged transfer path run, and be tested, without a GPU.

#ifndef TRIDENT_COMMON_BACKEND_HOST_KV_COPIER_H_
#define TRIDENT_COMMON_BACKEND_HOST_KV_COPIER_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/backend/kv_copier.h"
#include "common/backend/model_backend.h"

namespace trident::backend {

// Thread-safe.
class HostKvCopier final : public KvCopier {
 public:
  // INVALID_ARGUMENT when `memory` is device memory or has no base.
  static absl::StatusOr<std::unique_ptr<HostKvCopier>> Create(const KvMemory& memory);

  absl::StatusOr<std::unique_ptr<HostBuffer>> AllocateHost(size_t size_bytes) override;
  absl::Status CopyToHost(absl::Span<const KvRange> ranges, void* dst) override;
  absl::Status CopyFromHost(const void* src, absl::Span<const KvRange> ranges) override;

  // Calls of CopyToHost / CopyFromHost that returned OK.
  int64_t copies_to_host() const;
  int64_t copies_from_host() const;

 private:
  HostKvCopier(char* base, uint64_t bytes) : base_(base), bytes_(bytes) {}

  char* const base_;
  const uint64_t bytes_;
  mutable absl::Mutex mu_;
  int64_t copies_to_host_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t copies_from_host_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace trident::backend

#endif  // TRIDENT_COMMON_BACKEND_HOST_KV_COPIER_H_
