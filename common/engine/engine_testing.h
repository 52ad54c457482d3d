#ifndef TRIDENT_COMMON_ENGINE_ENGINE_TESTING_H_
#define TRIDENT_COMMON_ENGINE_ENGINE_TESTING_H_

// Helpers the engine's tests share (testonly): a greedy request, and the
// fake backend's own greedy continuation computed without any scheduler,
// which every schedule (batched, chunked, preempted, cached) must reproduce.

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/backend/fake_model_backend.h"
#include "common/engine/request.h"

namespace trident::engine {

inline EngineRequest Greedy(std::string id, std::vector<int32_t> prompt, int32_t max_tokens) {
  EngineRequest r;
  r.id = std::move(id);
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

// The `n` tokens the fake model's greedy continuation of `history` gives.
inline std::vector<int32_t> ExpectedGreedy(const backend::FakeModelBackend& fake,
                                           std::vector<int32_t> history, int32_t n) {
  std::vector<int32_t> out;
  std::vector<float> logits(static_cast<size_t>(fake.vocab_size()));
  for (int32_t i = 0; i < n; ++i) {
    fake.LogitsFor(history, logits.data());
    const int32_t best =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(best);
    history.push_back(best);
  }
  return out;
}

}  // namespace trident::engine

#endif  // TRIDENT_COMMON_ENGINE_ENGINE_TESTING_H_
