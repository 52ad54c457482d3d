// A GPU-to-GPU KV lane between processes of one host: a backend exports
// its KV pool (a CUDA IPC handle per tensor-parallel rank), a peer process
// maps the export and copies KV straight from its own pool into it on the
// copy engines, over NVLink where the GPUs have it. The KV transport uses it
// beside UCX when both ends share a host (common/transport/kv/peer_lane_kv.h):
//
//   decode worker:  lane.Export()        -> KvDestination.peer_pool
//   prefill worker: lane.Open(export)    -> a KvPeerPool (mapped once per
//                                           peer incarnation)
//                   lane.Copy(pool, copies, done)   for each layer
//
// Offsets on both sides are those of the TP = 1 layout of the pools (a
// tensor-parallel pool's view, model/tensor_parallel/kv_view.h), so ends of
// different TP degrees exchange KV, the lane re-sharding heads.

#ifndef TRIDENT_COMMON_BACKEND_KV_PEER_LANE_H_
#define TRIDENT_COMMON_BACKEND_KV_PEER_LANE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/kv/kv_layout.h"

namespace trident::backend {

// What a peer needs to map a pool: its TP = 1 layout, and one opaque
// handle per rank, in rank order (a CUDA IPC handle: cudaIpcMemHandle_t's
// bytes).
struct KvPeerExport {
  kv::KvCacheSpec spec;
  std::vector<std::string> rank_handles;
};

// `bytes` from byte `local_offset` of this pool to byte `peer_offset` of the
// peer's (both in the TP = 1 layout).
struct KvPeerCopy {
  uint64_t local_offset = 0;
  uint64_t peer_offset = 0;
  uint64_t bytes = 0;

  friend bool operator==(const KvPeerCopy&, const KvPeerCopy&) = default;
};

// A peer's pool mapped into this process; unmapped when the last reference
// goes (copies in flight hold one). Thread-safe (immutable).
class KvPeerPool {
 public:
  virtual ~KvPeerPool() = default;
  // Bytes of the peer's pool (its TP = 1 layout).
  virtual uint64_t bytes() const = 0;
};

// Thread-safe.
class KvPeerLane {
 public:
  virtual ~KvPeerLane() = default;

  // The lane's name ("cuda_ipc"), as transfers report it.
  virtual std::string name() const = 0;

  // This pool's export. Errors are the implementation's (CUDA's, as
  // INTERNAL).
  virtual absl::StatusOr<KvPeerExport> Export() const = 0;

  // Maps a peer's export. INVALID_ARGUMENT for a malformed export, one
  // whose layout differs from this pool's but for its block count, or one
  // whose rank count this model cannot split its heads over;
  // FAILED_PRECONDITION when the export cannot be mapped here (another
  // host's, a process without access to that GPU, this very process's).
  virtual absl::StatusOr<std::shared_ptr<KvPeerPool>> Open(const KvPeerExport& peer) = 0;

  // Enqueues `copies` and returns; `done` runs once, on a thread of the
  // lane's, when all of them have landed in the peer's memory (OK) or with
  // the first error. INVALID_ARGUMENT (through `done`, nothing copied) for a
  // copy outside either pool. REQUIRES: whatever wrote the local bytes has
  // completed (as KvCopier::CopyToHost requires); `peer` came from this
  // lane's Open.
  virtual void Copy(const std::shared_ptr<KvPeerPool>& peer, absl::Span<const KvPeerCopy> copies,
                    std::function<void(absl::Status)> done) = 0;
};

}  // namespace trident::backend

#endif  // TRIDENT_COMMON_BACKEND_KV_PEER_LANE_H_
