// For the CUDA IPC lane's test and benchmark: CUDA IPC maps only another
// process's memory, so the peer pool lives in a child process (this same
// binary, re-executed) driven over pipes, one command a line:
//
//   pools P S B D SEED -> "handles H..."  allocates the pools of preset P's
//                         KV (B blocks of 16 tokens) at TP S (0: one plain
//                         pool) on device D, filled from the TP = 1 bytes of
//                         seed SEED (0: zeros, cheaply), exported
//   dump PATH          -> "ok"            writes each rank's pool, in order
//   exit
//
// A main calls MaybeRunPeerChild first thing.

#ifndef TRIDENT_COMMON_BACKEND_CUDA_CUDA_PEER_LANE_TESTING_H_
#define TRIDENT_COMMON_BACKEND_CUDA_CUDA_PEER_LANE_TESTING_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/cuda/cuda_peer_lane.h"
#include "common/kv/kv_layout.h"
#include "common/model/config.h"
#include "common/model/tensor_parallel/kv_view.h"

namespace trident::backend::peer_lane_testing {

// A preset's config (model/generate's presets).
absl::StatusOr<model::ModelConfig> PresetConfig(const std::string& preset);

// A preset's KV at TP `size` (0: one plain pool): the TP = 1 spec, the view
// (none for a plain pool) and one rank's bytes.
struct PoolShape {
  kv::KvCacheSpec spec;
  std::optional<model::KvView> view;
  uint64_t rank_bytes = 0;

  int32_t ranks() const { return view.has_value() ? view->size() : 1; }
  model::KvPoolSide side() const {
    return {view.has_value() ? &*view : nullptr, spec.TotalBytes()};
  }
};
absl::StatusOr<PoolShape> ShapeOf(const model::ModelConfig& config, int32_t size,
                                  int32_t num_blocks);

// TP = 1 bytes from `seed`.
std::vector<uint8_t> RandomViewBytes(uint64_t bytes, uint32_t seed);

// Each rank's pool bytes holding `view_bytes` (every replica).
std::vector<std::vector<uint8_t>> ScatterView(const PoolShape& shape,
                                              const std::vector<uint8_t>& view_bytes);
// The TP = 1 bytes `pools` hold, and whether every replica agrees.
bool GatherView(const PoolShape& shape, const std::vector<std::vector<uint8_t>>& pools,
                std::vector<uint8_t>* view_bytes);

// Device pools (cudaMalloc, one per rank) on `device`, freed at the end.
class DevicePools {
 public:
  static absl::StatusOr<std::unique_ptr<DevicePools>> Create(const PoolShape& shape,
                                                             int32_t device);
  ~DevicePools();
  absl::Status Fill(const std::vector<std::vector<uint8_t>>& pools);
  absl::StatusOr<std::vector<std::vector<uint8_t>>> Read() const;
  const std::vector<CudaKvPeerLane::RankPool>& ranks() const { return ranks_; }

 private:
  explicit DevicePools(std::vector<CudaKvPeerLane::RankPool> ranks) : ranks_(std::move(ranks)) {}
  std::vector<CudaKvPeerLane::RankPool> ranks_;
};

// The child process.
class PeerProcess {
 public:
  // Starts this binary as a peer (/proc/self/exe --peer_lane_child).
  static absl::StatusOr<std::unique_ptr<PeerProcess>> Start();
  // Sends "exit" and waits for the child.
  ~PeerProcess();
  // Sends one command; its reply line, or INTERNAL with the child's error.
  absl::StatusOr<std::string> Command(const std::string& line);
  // "pools ..." and its export.
  absl::StatusOr<KvPeerExport> Pools(const std::string& preset, int32_t size, int32_t num_blocks,
                                     int32_t device, uint32_t seed);
  // "dump ..." read back: each rank's pool.
  absl::StatusOr<std::vector<std::vector<uint8_t>>> Dump(int32_t ranks, uint64_t rank_bytes);

 private:
  PeerProcess(pid_t pid, int to_child, int from_child)
      : pid_(pid), to_child_(to_child), from_child_(from_child) {}
  pid_t pid_;
  int to_child_;
  int from_child_;
};

// Runs the child's command loop and returns true when argv asks for it
// (the caller then exits); else false.
bool MaybeRunPeerChild(int argc, char** argv);

}  // namespace trident::backend::peer_lane_testing

#endif  // TRIDENT_COMMON_BACKEND_CUDA_CUDA_PEER_LANE_TESTING_H_
