#include "services/worker/offload/offload_policy.h"

#include <algorithm>

namespace trident::worker {

std::vector<OffloadChoice> ChooseOffloads(const std::vector<engine::OffloadCandidate>& candidates,
                                          PoolOccupancy pool, const OffloadPolicyOptions& options) {
  std::vector<const engine::OffloadCandidate*> longest;
  for (const engine::OffloadCandidate& c : candidates) longest.push_back(&c);
  std::stable_sort(longest.begin(), longest.end(),
                   [](const auto* a, const auto* b) { return a->num_computed > b->num_computed; });
  std::vector<OffloadChoice> chosen;
  std::vector<bool> taken(longest.size(), false);
  int64_t free = pool.blocks_free;
  const auto take = [&](size_t i, OffloadRule rule) {
    taken[i] = true;
    chosen.push_back(OffloadChoice{longest[i]->id, rule});
    free += static_cast<int64_t>(longest[i]->blocks.size());
  };
  for (size_t i = 0; i < longest.size() && static_cast<int32_t>(chosen.size()) < options.max_moves;
       ++i) {
    if (options.min_context_tokens > 0 && longest[i]->num_computed >= options.min_context_tokens) {
      take(i, OffloadRule::kLongContext);
    }
  }
  const int64_t wanted = pool.blocks_wanted <= pool.blocks_total ? pool.blocks_wanted : 0;
  const auto short_of_blocks = [&] {
    return options.low_watermark > 0 && pool.blocks_total > 0 &&
           (static_cast<double>(free) < options.low_watermark * pool.blocks_total || free < wanted);
  };
  for (size_t i = 0; i < longest.size() &&
                     static_cast<int32_t>(chosen.size()) < options.max_moves && short_of_blocks();
       ++i) {
    if (!taken[i]) take(i, OffloadRule::kPoolPressure);
  }
  return chosen;
}

}  // namespace trident::worker
