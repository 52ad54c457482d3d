#ifndef TRIDENT_COMMON_ENGINE_ENGINE_TESTING_H_
#define TRIDENT_COMMON_ENGINE_ENGINE_TESTING_H_

// Helpers the engine's tests and the backends' share (testonly): a greedy
// request; the fake backend's own greedy continuation computed without any
// scheduler, which every schedule (batched, chunked, preempted, cached) must
// reproduce; and a core stepped until it is idle.

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/backend/fake_model_backend.h"
#include "common/backend/model_backend.h"
#include "common/engine/engine_core.h"
#include "common/engine/request.h"
#include "common/kv/paged_block_allocator.h"
#include "gtest/gtest.h"

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

// Steps `core` until it has no work: each request's tokens by id. A failed
// step fails the calling test and ends the run.
inline std::map<std::string, std::vector<int32_t>> DrainTokens(EngineCore& core) {
  std::map<std::string, std::vector<int32_t>> out;
  while (core.HasWork()) {
    auto events = core.Step();
    if (!events.ok()) {
      ADD_FAILURE() << "engine step: " << events.status();
      break;
    }
    for (const TokenEvent& ev : *events) out[ev.request_id].push_back(ev.token);
  }
  return out;
}

// Greedy continuations through an EngineCore over `backend` with `options`:
// request i (of those in `which`, every prompt when it is empty; all added
// at once) continues prompts[i] by lengths[i] tokens. Returns the tokens by
// prompt index (empty for those not run), and checks that every KV block
// came back.
inline std::vector<std::vector<int32_t>> GreedyThroughEngine(
    backend::ModelBackend* backend, const std::vector<std::vector<int32_t>>& prompts,
    const std::vector<int32_t>& lengths, const std::vector<size_t>& which,
    const EngineOptions& options) {
  kv::PagedBlockAllocator allocator(backend->kv_capacity().num_blocks);
  EngineCore core(backend, &allocator, options);
  for (size_t p = 0; p < prompts.size(); ++p) {
    if (!which.empty() && std::find(which.begin(), which.end(), p) == which.end()) continue;
    const absl::Status added = core.Add(Greedy(std::to_string(p), prompts[p], lengths[p]));
    EXPECT_TRUE(added.ok()) << "prompt " << p << ": " << added;
  }
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (auto& [id, tokens] : DrainTokens(core)) out[std::stoul(id)] = std::move(tokens);
  EXPECT_EQ(allocator.num_free(), allocator.num_total());
  return out;
}

}  // namespace trident::engine

#endif  // TRIDENT_COMMON_ENGINE_ENGINE_TESTING_H_
