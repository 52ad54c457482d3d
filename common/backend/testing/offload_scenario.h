// What the offloading backends' tests share: copying a sequence's KV from a
// pool (in host memory) into a FakeRemoteAttention, and the engine scenario
// in which requests move to the service, the service dies and they come
// back by recompute.

#ifndef TRIDENT_COMMON_BACKEND_TESTING_OFFLOAD_SCENARIO_H_
#define TRIDENT_COMMON_BACKEND_TESTING_OFFLOAD_SCENARIO_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/backend/model_backend.h"
#include "common/engine/engine_core.h"
#include "common/kv/kv_layout.h"
#include "common/transport/attention/fake_remote_attention.h"

namespace trident::backend::testing {

// Writes positions [0, n) of the sequence in `blocks` of a pool laid out by
// `spec` at `pool` (host memory; any KV dtype) into `fake` under `handle`.
void MigrateToFake(const char* pool, const kv::KvCacheSpec& spec,
                   absl::Span<const int32_t> blocks, int32_t n, uint64_t handle,
                   transport::attention::FakeRemoteAttention& fake);

// Four greedy requests of 20-41 prompt tokens, 24 output tokens each.
std::vector<engine::EngineRequest> OffloadScenarioRequests();

struct OffloadScenarioRun {
  std::map<std::string, std::vector<int32_t>> tokens;  // per request
  int64_t step_errors = 0;       // failed steps and kError finishes
  int64_t moves_failed = 0;      // MoveToRemote calls that failed
  int32_t remote_at_move = 0;    // remote_running right after the moves
  engine::EngineStats stats;     // at the end
  int32_t blocks_leaked = 0;     // total - free at the end
  int32_t released = 0;          // remote releases the listener saw
};

// Runs `requests` on an EngineCore over `backend` to completion. With
// `offload`: before step 6 every offload candidate moves to `fake` (its KV
// copied by `migrate(blocks, n, handle)`), and before step 14 `fake` dies.
OffloadScenarioRun RunOffloadScenario(
    ModelBackend& backend, transport::attention::FakeRemoteAttention& fake,
    const std::vector<engine::EngineRequest>& requests, bool offload,
    const std::function<void(absl::Span<const int32_t> blocks, int32_t n, uint64_t handle)>&
        migrate);

}  // namespace trident::backend::testing

#endif  // TRIDENT_COMMON_BACKEND_TESTING_OFFLOAD_SCENARIO_H_
