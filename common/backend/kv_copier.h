// Copies between a backend's KV pool and host memory, for KV transports that
// cannot reach the pool's memory themselves: CUDA device memory when UCX was
// built without CUDA support. The transport stages a layer's blocks through
// host buffers: CopyToHost on the sending side, CopyFromHost on the
// receiving side (common/transport/kv/ucx_kv.h).
//
//   pool (device) --CopyToHost--> staging (host) --UCX--> receive buffer
//   (host) --CopyFromHost--> pool (device)

#ifndef TRIDENT_COMMON_BACKEND_KV_COPIER_H_
#define TRIDENT_COMMON_BACKEND_KV_COPIER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace trident::backend {

// `length_bytes` bytes at byte `offset_bytes` of a KV pool (from its
// KvMemory::base).
struct KvRange {
  uint64_t offset_bytes = 0;
  uint64_t length_bytes = 0;

  friend bool operator==(const KvRange&, const KvRange&) = default;
};

// INVALID_ARGUMENT naming the range ("ranges[3]") when one is empty or does
// not lie in a pool of `pool_bytes` bytes.
absl::Status CheckKvRanges(absl::Span<const KvRange> ranges, uint64_t pool_bytes);

// The sum of the ranges' lengths.
uint64_t TotalBytes(absl::Span<const KvRange> ranges);

// Host memory from KvCopier::AllocateHost; frees it when destroyed (which
// needs no copier: it may outlive the one that allocated it). Thread-safe
// (immutable).
class HostBuffer {
 public:
  HostBuffer(void* data, size_t size_bytes, std::function<void(void*)> free)
      : data_(data), size_bytes_(size_bytes), free_(std::move(free)) {}
  ~HostBuffer() {
    if (data_ != nullptr && free_) free_(data_);
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  char* data() const { return static_cast<char*>(data_); }
  size_t size_bytes() const { return size_bytes_; }

 private:
  void* const data_;
  const size_t size_bytes_;
  const std::function<void(void*)> free_;
};

// Copies between one KV pool and host memory. Every call returns once the
// bytes are in place (the caller pipelines: e.g. copies layer l + 1 while
// the network sends layer l). Thread-safe: calls in one direction run one at
// a time; a CopyToHost and a CopyFromHost may run at once (the CUDA copier
// uses a stream for each direction).
class KvCopier {
 public:
  virtual ~KvCopier() = default;

  // `size_bytes` (> 0) of host memory that CopyToHost writes and
  // CopyFromHost reads at full speed (page-locked for CUDA).
  // RESOURCE_EXHAUSTED when it cannot be had; INVALID_ARGUMENT for 0.
  virtual absl::StatusOr<std::unique_ptr<HostBuffer>> AllocateHost(size_t size_bytes) = 0;

  // Copies `ranges` of the pool, in order and back to back, into `dst`.
  // INVALID_ARGUMENT (and no copy) for a range outside the pool (see
  // CheckKvRanges); INTERNAL for a failed copy.
  // REQUIRES: `dst` holds TotalBytes(ranges) bytes; whatever wrote those
  // bytes of the pool has completed (for CUDA: on the device, e.g. its
  // stream synchronized, or a host function enqueued after it has run, as
  // ModelBackend's layer observer is).
  virtual absl::Status CopyToHost(absl::Span<const KvRange> ranges, void* dst) = 0;

  // Copies TotalBytes(ranges) bytes from `src` (any host memory: it need not
  // come from AllocateHost) into `ranges` of the pool, in order. Errors as
  // CopyToHost. When it returns OK, later work on the pool on any stream
  // sees the bytes.
  virtual absl::Status CopyFromHost(const void* src, absl::Span<const KvRange> ranges) = 0;
};

}  // namespace trident::backend

#endif  // TRIDENT_COMMON_BACKEND_KV_COPIER_H_
