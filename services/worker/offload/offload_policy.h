// Which resident decoding sequences a decode worker moves to CPU attention
// services before a step: a pure function of the candidates, the KV pool's
// occupancy and the options, tested without an engine.
//
//   1. Long context: a sequence whose context reaches min_context_tokens
//      goes to the CPU (placement at admission: it is a candidate from its
//      first decode step).
//   2. Pool pressure: while the free share of the KV pool is below
//      low_watermark, or the free blocks are fewer than the first waiting
//      sequence needs to start, the longest resident sequences move out
//      (each frees its blocks) instead of being preempted and recomputed
//      later, or of keeping the waiting one out until one of them ends.
//
// At most max_moves per step (a move copies the sequence's KV); longest
// first within each rule.

#ifndef TRIDENT_SERVICES_WORKER_OFFLOAD_OFFLOAD_POLICY_H_
#define TRIDENT_SERVICES_WORKER_OFFLOAD_OFFLOAD_POLICY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/engine/engine_core.h"

namespace trident::worker {

struct OffloadPolicyOptions {
  // Rule 1's threshold in tokens; 0 turns rule 1 off.
  int32_t min_context_tokens = 0;
  // Rule 2's free share of the pool, in [0, 1); 0 turns rule 2 off.
  double low_watermark = 0.0;
  // Moves per step, > 0.
  int32_t max_moves = 4;
};

struct PoolOccupancy {
  int32_t blocks_free = 0;
  int32_t blocks_total = 0;
  // Blocks the first waiting sequence needs (EngineStats::
  // waiting_head_blocks); one that needs more than the pool is ignored.
  int32_t blocks_wanted = 0;
};

// Which rule chose a move: long context (1) or pool pressure (2).
enum class OffloadRule { kLongContext, kPoolPressure };

struct OffloadChoice {
  std::string id;
  OffloadRule rule = OffloadRule::kLongContext;
};

// The sequences to move, in order.
std::vector<OffloadChoice> ChooseOffloads(const std::vector<engine::OffloadCandidate>& candidates,
                                          PoolOccupancy pool, const OffloadPolicyOptions& options);

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_OFFLOAD_OFFLOAD_POLICY_H_
