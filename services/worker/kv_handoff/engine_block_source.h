#ifndef TRIDENT_SERVICES_WORKER_KV_HANDOFF_ENGINE_BLOCK_SOURCE_H_
#define TRIDENT_SERVICES_WORKER_KV_HANDOFF_ENGINE_BLOCK_SOURCE_H_

// The engine's KV allocator as the reservations' BlockSource: reserved
// blocks come out of the pool the engine's sequences use, and go back to it.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/engine/engine.h"
#include "services/worker/kv_handoff/kv_reservations.h"

namespace trident::worker {

// Thread-safe, as engine::Engine's ReserveBlocks and FreeBlocks are.
class EngineBlockSource final : public BlockSource {
 public:
  // `engine` (not owned) must outlive this.
  explicit EngineBlockSource(engine::Engine* engine) : engine_(engine) {}

  // RESOURCE_EXHAUSTED when fewer blocks are free (engine::Engine::ReserveBlocks).
  absl::StatusOr<std::vector<int32_t>> Reserve(int32_t num_blocks) override {
    return engine_->ReserveBlocks(num_blocks);
  }
  absl::Status Free(absl::Span<const int32_t> blocks) override {
    return engine_->FreeBlocks(blocks);
  }
  std::vector<int32_t> AcquireCached(absl::Span<const int32_t> tokens,
                                     const std::string& cache_salt, int32_t max_blocks) override {
    return engine_->AcquireCachedPrefix(tokens, cache_salt, max_blocks);
  }

 private:
  engine::Engine* const engine_;
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_KV_HANDOFF_ENGINE_BLOCK_SOURCE_H_
