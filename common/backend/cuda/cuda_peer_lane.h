// The CUDA IPC KV lane (kv_peer_lane.h): a pool's ranks exported with
// cudaIpcGetMemHandle; a peer's ranks mapped with cudaIpcOpenMemHandle
// (peer access enabled lazily) on this pool's first device; each Copy
// planned rank to rank (model::PlanRankCopies: both sides' views, so TP
// degrees may differ) and enqueued on one stream of that device:
//
//   few copies (a fresh prompt's blocks collate into one run per layer)
//       -> cudaMemcpyAsync each, on the copy engines
//   many copies of one size (a fragmented pool, heads re-sharded)
//       -> one block_copy kernel launch for them (issuing thousands of
//          copy-engine calls would cost microseconds each)
//
// then an event; a completion thread of the lane waits for the events in
// order and runs the callbacks. Copies in flight hold their peer pool, so a
// peer's mapping is closed only after its last copy ended.

#ifndef TRIDENT_COMMON_BACKEND_CUDA_CUDA_PEER_LANE_H_
#define TRIDENT_COMMON_BACKEND_CUDA_CUDA_PEER_LANE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/backend/cuda/tp_kv_copier.h"
#include "common/backend/kv_peer_lane.h"
#include "common/kv/kv_layout.h"
#include "common/model/config.h"
#include "common/model/tensor_parallel/kv_view.h"

namespace trident::backend {

struct CudaPeerLaneOptions {
  // At least this many copies of one size go as one kernel launch; fewer
  // (and copies of odd sizes or alignments) go on the copy engines.
  int32_t kernel_min_copies = 16;
  // Streams that successive Copy calls take in turn, so that one layer's
  // copies start while the previous layer's finish (each copy-engine
  // operation has a fixed start-up cost of microseconds). 1 to 8.
  int32_t streams = 2;
};

// Thread-safe.
class CudaKvPeerLane final : public KvPeerLane {
 public:
  // Rank r's pool (`base`: the first byte of a cudaMalloc allocation).
  using RankPool = TensorParallelKvCopier::RankPool;
  // `spec`: the pool's TP = 1 layout; `ranks`: one pool (laid out as `spec`)
  // or a tensor-parallel group's (each its share of the heads; peer access
  // enabled between the first rank's device and the others'). `config` is
  // the model's (a peer's view derives from it). INVALID_ARGUMENT when the
  // pools do not make `spec`'s view; INTERNAL for CUDA errors.
  static absl::StatusOr<std::unique_ptr<CudaKvPeerLane>> Create(const model::ModelConfig& config,
                                                                const kv::KvCacheSpec& spec,
                                                                std::vector<RankPool> ranks,
                                                                CudaPeerLaneOptions options = {});
  // Waits for the copies in flight and runs their callbacks.
  ~CudaKvPeerLane() override;

  std::string name() const override { return "cuda_ipc"; }
  absl::StatusOr<KvPeerExport> Export() const override;
  absl::StatusOr<std::shared_ptr<KvPeerPool>> Open(const KvPeerExport& peer) override;
  void Copy(const std::shared_ptr<KvPeerPool>& peer, absl::Span<const KvPeerCopy> copies,
            std::function<void(absl::Status)> done) override;

  // Copies that went as kernel launches and as copy-engine calls, so far.
  int64_t kernel_copies() const;
  int64_t engine_copies() const;

 private:
  struct Pending {
    cudaEvent_t event = nullptr;
    std::function<void(absl::Status)> done;
    std::shared_ptr<KvPeerPool> peer;
  };

  CudaKvPeerLane(const model::ModelConfig& config, const kv::KvCacheSpec& spec,
                 std::optional<model::KvView> view, std::vector<RankPool> ranks,
                 CudaPeerLaneOptions options);
  // One stream of the lane, with the kernel's pointer arrays on the device
  // (src then dst), grown as needed and refilled only in the stream's
  // order, after its last launch read them.
  struct Stream {
    cudaStream_t stream = nullptr;
    void** pointers = nullptr;
    int64_t capacity = 0;
  };
  // Enqueues the rank copies on `stream`; the first CUDA error.
  absl::Status Enqueue(const std::vector<model::KvCopyRun>& copies,
                       const std::vector<char*>& peer_bases, Stream& stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Launches block_copy for `copies` (all of one size).
  absl::Status LaunchKernel(const std::vector<const model::KvCopyRun*>& copies,
                            const std::vector<char*>& peer_bases, Stream& stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CompletionLoop();

  const model::ModelConfig config_;
  const kv::KvCacheSpec spec_;
  // This pool's view; none for one pool laid out as spec_.
  const std::optional<model::KvView> view_;
  const std::vector<RankPool> ranks_;
  const CudaPeerLaneOptions options_;

  mutable absl::Mutex mu_;
  std::vector<Stream> streams_ ABSL_GUARDED_BY(mu_);
  size_t next_stream_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  // Events of ended copies, for the next ones.
  std::vector<cudaEvent_t> free_events_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t kernel_copies_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t engine_copies_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread completion_;
};

}  // namespace trident::backend

#endif  // TRIDENT_COMMON_BACKEND_CUDA_CUDA_PEER_LANE_H_
