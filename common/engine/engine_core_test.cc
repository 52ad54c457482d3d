#include "common/engine/engine_core.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/backend/fake_model_backend.h"
#include "common/engine/engine_testing.h"
#include "common/kv/paged_block_allocator.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::engine {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr int32_t kVocab = 97;
constexpr int32_t kBlockSize = 4;

struct Harness {
  Harness(int32_t num_blocks, EngineOptions options, int32_t max_model_len = 512)
      : backend(kVocab, num_blocks, kBlockSize, max_model_len),
        allocator(num_blocks),
        core(&backend, &allocator, options) {}

  // Steps until idle; returns each request's tokens and finish reason.
  // Every request's outputs must be numbered from `first_index` (a resumed
  // request's from its resumed outputs).
  std::map<std::string, std::vector<int32_t>> RunToCompletion(
      std::map<std::string, FinishReason>* reasons = nullptr, int32_t first_index = 0) {
    std::map<std::string, std::vector<int32_t>> out;
    int guard = 0;
    while (core.HasWork()) {
      auto events = core.Step();
      EXPECT_THAT(events.status(), IsOk());
      if (!events.ok()) break;
      for (const TokenEvent& ev : *events) {
        EXPECT_EQ(ev.output_index, first_index + static_cast<int32_t>(out[ev.request_id].size()));
        out[ev.request_id].push_back(ev.token);
        if (reasons != nullptr && ev.finish != FinishReason::kNone) {
          (*reasons)[ev.request_id] = ev.finish;
        }
      }
      EXPECT_LT(++guard, 100000) << "engine does not make progress";
      if (guard >= 100000) break;
    }
    return out;
  }

  backend::FakeModelBackend backend;
  kv::PagedBlockAllocator allocator;
  EngineCore core;
};

std::vector<int32_t> RandomPrompt(std::mt19937& rng, int32_t len) {
  std::uniform_int_distribution<int32_t> tok(0, kVocab - 1);
  std::vector<int32_t> p(len);
  for (auto& t : p) t = tok(rng);
  return p;
}

std::vector<int32_t> RandomPromptOf(int32_t len) {
  std::mt19937 rng(len);
  return RandomPrompt(rng, len);
}

TEST(EngineCoreTest, SingleRequestMatchesTheModelsGreedyContinuation) {
  Harness h(64, {});
  ASSERT_THAT(h.core.Add(Greedy("a", {1, 2, 3, 4, 5}, 12)), IsOk());
  std::map<std::string, FinishReason> reasons;
  auto out = h.RunToCompletion(&reasons);
  EXPECT_THAT(out["a"], ElementsAreArray(ExpectedGreedy(h.backend, {1, 2, 3, 4, 5}, 12)));
  EXPECT_EQ(reasons["a"], FinishReason::kLength);
  EXPECT_EQ(h.allocator.num_free(), 64);
}

TEST(EngineCoreTest, ChunkedPrefillKeepsEveryStepWithinTheTokenBudget) {
  EngineOptions options;
  options.max_batch_tokens = 7;
  Harness h(64, options);
  std::mt19937 rng(7);
  const auto prompt = RandomPrompt(rng, 45);
  ASSERT_THAT(h.core.Add(Greedy("long", prompt, 5)), IsOk());
  ASSERT_THAT(h.core.Add(Greedy("short", {3, 1, 4}, 5)), IsOk());
  auto out = h.RunToCompletion();
  EXPECT_THAT(out["long"], ElementsAreArray(ExpectedGreedy(h.backend, prompt, 5)));
  EXPECT_THAT(out["short"], ElementsAreArray(ExpectedGreedy(h.backend, {3, 1, 4}, 5)));
  EXPECT_LE(h.backend.max_step_tokens(), 7);
  EXPECT_EQ(h.allocator.num_free(), 64);
}

TEST(EngineCoreTest, WhileSequencesDecodeAPromptTakesAtMostItsCapPerStep) {
  EngineOptions options;
  options.max_batch_tokens = 64;
  options.max_prefill_tokens_while_decoding = 8;
  Harness h(64, options);
  std::mt19937 rng(11);
  const auto long_prompt = RandomPrompt(rng, 40);
  ASSERT_THAT(h.core.Add(Greedy("long", long_prompt, 4)), IsOk());
  // Nothing decodes yet: the whole prompt runs in one step.
  ASSERT_THAT(h.core.Step(), IsOk());
  EXPECT_EQ(h.core.stats().last_step_prefill_tokens, 40);
  ASSERT_THAT(h.core.Add(Greedy("later", RandomPromptOf(30), 4)), IsOk());
  ASSERT_THAT(h.core.Step(), IsOk());
  // "long" decodes: "later"'s 30 prompt tokens go 8, 8, 8, 6.
  EXPECT_EQ(h.core.stats().last_step_prefill_tokens, 8);
  EXPECT_EQ(h.core.stats().last_step_decode_sequences, 1);
  std::vector<int32_t> chunks;
  while (h.core.HasWork()) {
    ASSERT_THAT(h.core.Step(), IsOk());
    if (h.core.stats().last_step_prefill_tokens > 0) {
      chunks.push_back(h.core.stats().last_step_prefill_tokens);
    }
  }
  EXPECT_THAT(chunks, ElementsAreArray({8, 8, 6}));
  EXPECT_EQ(h.allocator.num_free(), 64);
}

// A backlog of prompt tokens at or past prefill_backlog_tokens raises the
// cap to max_prefill_tokens_when_backlogged for as long as it lasts.
TEST(EngineCoreTest, ABacklogRaisesThePromptCapWhileItLasts) {
  EngineOptions options;
  options.max_batch_tokens = 64;
  options.max_prefill_tokens_while_decoding = 8;
  options.max_prefill_tokens_when_backlogged = 24;
  options.prefill_backlog_tokens = 40;
  Harness h(64, options);
  std::mt19937 rng(13);
  const auto first = RandomPrompt(rng, 10);
  ASSERT_THAT(h.core.Add(Greedy("first", first, 30)), IsOk());
  ASSERT_THAT(h.core.Step(), IsOk());  // its whole prompt: nothing decodes yet
  std::map<std::string, std::vector<int32_t>> prompts;
  for (const std::string id : {"a", "b"}) {
    prompts[id] = RandomPrompt(rng, 30);
    ASSERT_THAT(h.core.Add(Greedy(id, prompts[id], 4)), IsOk());
  }
  std::map<std::string, std::vector<int32_t>> out;
  auto step = [&] {
    auto events = h.core.Step();
    ASSERT_THAT(events, IsOk());
    for (const TokenEvent& ev : *events) out[ev.request_id].push_back(ev.token);
  };
  // 60 prompt tokens wait: the raised cap.
  step();
  EXPECT_EQ(h.core.stats().last_step_prefill_tokens, 24);
  EXPECT_EQ(h.core.stats().backlogged_steps_total, 1);
  // 36 left, under the threshold: the cap again.
  step();
  EXPECT_EQ(h.core.stats().last_step_prefill_tokens, 8);
  EXPECT_EQ(h.core.stats().backlogged_steps_total, 1);
  while (h.core.HasWork()) step();
  for (const auto& [id, prompt] : prompts) {
    EXPECT_THAT(out.at(id), ElementsAreArray(ExpectedGreedy(h.backend, prompt, 4))) << id;
  }
  EXPECT_EQ(h.core.stats().backlogged_steps_total, 1);
  EXPECT_EQ(h.allocator.num_free(), 64);
}

TEST(EngineCoreTest, CappedPromptsGiveTheSameTokens) {
  EngineOptions options;
  options.max_batch_tokens = 32;
  options.max_prefill_tokens_while_decoding = 5;
  Harness h(256, options);
  std::mt19937 rng(12);
  std::map<std::string, std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    const std::string id = "r" + std::to_string(i);
    prompts[id] = RandomPrompt(rng, 9 + 7 * i);
    ASSERT_THAT(h.core.Add(Greedy(id, prompts[id], 6)), IsOk());
  }
  const auto out = h.RunToCompletion();
  for (const auto& [id, prompt] : prompts) {
    EXPECT_THAT(out.at(id), ElementsAreArray(ExpectedGreedy(h.backend, prompt, 6))) << id;
  }
  EXPECT_EQ(h.allocator.num_free(), 256);
}

// 64 requests of mixed lengths in a cache too small for all of them: every
// request's tokens equal its solo run, preemption happens, and every block
// comes back. Covers greedy and seeded sampling.
TEST(EngineCoreTest, BatchInvariantUnderPreemption) {
  const uint32_t seed = 20261121;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 64; ++i) {
    EngineRequest r = Greedy(absl::StrCat("r", i), RandomPrompt(rng, 1 + rng() % 40),
                             1 + static_cast<int32_t>(rng() % 30));
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.top_k = 20;
      r.sampling.seed = 1000 + i;
    }
    requests.push_back(r);
  }
  // Solo runs, one engine per request.
  std::map<std::string, std::vector<int32_t>> solo;
  for (const auto& r : requests) {
    Harness h(64, {});
    ASSERT_THAT(h.core.Add(r), IsOk());
    solo[r.id] = h.RunToCompletion()[r.id];
    ASSERT_EQ(static_cast<int32_t>(solo[r.id].size()), r.max_tokens);
  }
  // Together, with 40 blocks of 4 tokens: at most ~160 live tokens.
  EngineOptions options;
  options.max_batch_tokens = 64;
  Harness h(40, options);
  for (const auto& r : requests) ASSERT_THAT(h.core.Add(r), IsOk());
  auto together = h.RunToCompletion();
  for (const auto& r : requests) {
    EXPECT_THAT(together[r.id], ElementsAreArray(solo[r.id])) << r.id;
  }
  EXPECT_GT(h.core.stats().preemptions_total, 0);
  EXPECT_EQ(h.allocator.num_free(), 40);
  EXPECT_EQ(h.core.stats().running, 0);
  EXPECT_EQ(h.core.stats().waiting, 0);
}

// A backend that samples on the device gets each wanted row's parameters,
// penalty state and output position, in batch order: the tokens equal the
// host sampler's under chunked prefill and preemption.
TEST(EngineCoreTest, DeviceSamplingGivesTheHostSamplersTokens) {
  const uint32_t seed = 1121;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 24; ++i) {
    EngineRequest r = Greedy(absl::StrCat("r", i), RandomPrompt(rng, 1 + rng() % 30),
                             1 + static_cast<int32_t>(rng() % 20));
    if (i % 3 != 0) {
      r.sampling.temperature = 0.9f;
      r.sampling.top_p = 0.8f;
      r.sampling.seed = 77 + i;
      r.sampling.repetition_penalty = 1.3f;
      r.sampling.frequency_penalty = 0.5f;
    }
    requests.push_back(r);
  }
  EngineOptions options;
  options.max_batch_tokens = 32;
  std::map<std::string, std::vector<int32_t>> outputs[2];
  for (int device = 0; device < 2; ++device) {
    Harness h(40, options);
    h.backend.set_samples_on_device(device == 1);
    for (const auto& r : requests) ASSERT_THAT(h.core.Add(r), IsOk());
    outputs[device] = h.RunToCompletion();
    EXPECT_EQ(h.backend.device_sampled_rows() > 0, device == 1);
    EXPECT_EQ(h.allocator.num_free(), 40);
  }
  for (const auto& r : requests) {
    EXPECT_THAT(outputs[1][r.id], ElementsAreArray(outputs[0][r.id])) << r.id;
    EXPECT_EQ(static_cast<int32_t>(outputs[1][r.id].size()), r.max_tokens) << r.id;
  }
}

// Disaggregated serving at the engine level: engine A computes prompts
// (prefill_only) and hands over their blocks; their "KV" is copied into
// blocks reserved on engine B, which adopts the sequences and decodes them.
// Every request's tokens equal a single engine's run, and both allocators
// end with every block free.
// Layer-wise overlap: a prefill_only request's on_layer_done runs for every
// layer, in order, in the step that computes its last chunk (before that
// step's kPrefilled event), with the blocks the event then hands over; never
// for other requests or other steps.
TEST(EngineCoreTest, PrefillOnlyRequestsHearOfEachLayerInTheirLastChunk) {
  EngineOptions options;
  options.max_batch_tokens = 16;  // a 40-token prompt takes three steps
  Harness h(64, options);
  h.backend.set_reported_layers(3);
  struct Report {
    std::string id;
    int32_t layer;
    std::vector<int32_t> blocks;
    int64_t step;
  };
  std::vector<Report> reports;
  int64_t step = 0;
  std::mt19937 rng(7);
  auto watched = [&](const std::string& id, int32_t len, bool prefill_only) {
    EngineRequest r = Greedy(id, RandomPrompt(rng, len), 4);
    r.prefill_only = prefill_only;
    r.on_layer_done = [&reports, &step, id](int32_t layer, const std::vector<int32_t>& blocks) {
      reports.push_back({id, layer, blocks, step});
    };
    return r;
  };
  ASSERT_THAT(h.core.Add(watched("long", 40, true)), IsOk());
  ASSERT_THAT(h.core.Add(watched("short", 5, true)), IsOk());
  ASSERT_THAT(h.core.Add(watched("plain", 6, false)), IsOk());
  std::map<std::string, std::pair<int64_t, std::vector<int32_t>>> prefilled;  // step, blocks
  while (h.core.HasWork()) {
    ++step;
    auto events = h.core.Step();
    ASSERT_THAT(events.status(), IsOk());
    for (const TokenEvent& ev : *events) {
      if (ev.finish != FinishReason::kPrefilled) continue;
      prefilled[ev.request_id] = {step, ev.prefilled_blocks};
      EXPECT_TRUE(h.core.ReleasePrefilled(ev.request_id));
    }
    ASSERT_LT(step, 100);
  }
  ASSERT_EQ(prefilled.size(), 2u);
  for (const std::string id : {"long", "short"}) {
    std::vector<int32_t> layers;
    for (const Report& r : reports) {
      if (r.id != id) continue;
      layers.push_back(r.layer);
      EXPECT_EQ(r.step, prefilled[id].first) << id;
      EXPECT_EQ(r.blocks, prefilled[id].second) << id;
    }
    EXPECT_EQ(layers, (std::vector<int32_t>{0, 1, 2})) << id;
  }
  for (const Report& r : reports) EXPECT_NE(r.id, "plain");
  EXPECT_EQ(prefilled["long"].second.size(), (40u + kBlockSize - 1) / kBlockSize);
  // Only steps with a final prefill chunk set the observer.
  EXPECT_EQ(h.backend.layer_reports(),
            3 * static_cast<int64_t>(
                    std::set<int64_t>{prefilled["long"].first, prefilled["short"].first}.size()));
}

TEST(EngineCoreTest, PrefillOnOneEngineDecodeOnAnotherEqualsOneEngine) {
  const uint32_t seed = 404;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 16; ++i) {
    EngineRequest r = Greedy(absl::StrCat("r", i), RandomPrompt(rng, 1 + rng() % 30),
                             1 + static_cast<int32_t>(rng() % 20));
    if (i % 2 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.seed = 90 + i;
    }
    requests.push_back(r);
  }
  EngineOptions options;
  options.max_batch_tokens = 24;  // chunked prompts
  Harness single(64, options);
  for (const auto& r : requests) ASSERT_THAT(single.core.Add(r), IsOk());
  auto expected = single.RunToCompletion();

  Harness prefill(64, options);
  Harness decode(64, options);
  std::map<std::string, std::vector<int32_t>> got;
  for (auto r : requests) {
    r.prefill_only = true;
    ASSERT_THAT(prefill.core.Add(r), IsOk());
  }
  std::map<std::string, EngineRequest> by_id;
  for (const auto& r : requests) by_id[r.id] = r;
  int handed_over = 0;
  while (prefill.core.HasWork() || decode.core.HasWork()) {
    if (prefill.core.HasWork()) {
      auto events = prefill.core.Step();
      ASSERT_THAT(events.status(), IsOk());
      for (const TokenEvent& ev : *events) {
        got[ev.request_id].push_back(ev.token);
        if (ev.finish != FinishReason::kPrefilled) continue;
        ASSERT_EQ(ev.output_index, 0);
        const EngineRequest& r = by_id[ev.request_id];
        ASSERT_EQ(ev.prefilled_blocks.size(), (r.prompt.size() + kBlockSize - 1) / kBlockSize);
        auto reserved = decode.allocator.Allocate(static_cast<int32_t>(ev.prefilled_blocks.size()));
        ASSERT_THAT(reserved.status(), IsOk());
        decode.backend.CopyKvBlocks(prefill.backend, ev.prefilled_blocks, *reserved);
        EXPECT_TRUE(prefill.core.ReleasePrefilled(ev.request_id));
        EXPECT_FALSE(prefill.core.ReleasePrefilled(ev.request_id));
        ASSERT_THAT(decode.core.AddPrefilled(r, *reserved, ev.token), IsOk());
        ++handed_over;
      }
    }
    if (decode.core.HasWork()) {
      auto events = decode.core.Step();
      ASSERT_THAT(events.status(), IsOk());
      for (const TokenEvent& ev : *events) {
        EXPECT_EQ(ev.output_index, static_cast<int32_t>(got[ev.request_id].size()));
        got[ev.request_id].push_back(ev.token);
      }
    }
  }
  for (const auto& r : requests) {
    EXPECT_THAT(got[r.id], ElementsAreArray(expected[r.id])) << r.id;
  }
  EXPECT_GT(handed_over, 0);
  EXPECT_EQ(prefill.core.prefilled_blocks_held(), 0);
  EXPECT_EQ(prefill.allocator.num_free(), 64);
  EXPECT_EQ(decode.allocator.num_free(), 64);
}

// A request resumed after k outputs (a migration: prompt + those outputs
// as the prompt, resumed_outputs = k) continues with the outputs its
// unbroken run drew after them, for every k, greedy and seeded sampling
// with penalties, on one engine and through a prefill/decode hand-over.
TEST(EngineCoreTest, AResumedRequestContinuesAsItsUnbrokenRun) {
  const uint32_t seed = 20261127;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  for (int variant = 0; variant < 2; ++variant) {
    EngineRequest r = Greedy(absl::StrCat("v", variant), RandomPrompt(rng, 9), 12);
    if (variant == 1) {
      r.sampling.temperature = 0.9f;
      r.sampling.top_k = 30;
      r.sampling.seed = 77;
      r.sampling.presence_penalty = 0.5f;
      r.sampling.frequency_penalty = 0.3f;
      r.sampling.repetition_penalty = 1.2f;
    }
    Harness whole(64, {});
    ASSERT_THAT(whole.core.Add(r), IsOk());
    const std::vector<int32_t> expected = whole.RunToCompletion()[r.id];
    ASSERT_EQ(expected.size(), 12u);
    for (int k = 1; k < r.max_tokens; ++k) {
      EngineRequest resumed = r;
      resumed.prompt.insert(resumed.prompt.end(), expected.begin(), expected.begin() + k);
      resumed.resumed_outputs = k;
      const std::vector<int32_t> rest(expected.begin() + k, expected.end());
      // One engine.
      Harness h(64, {});
      ASSERT_THAT(h.core.Add(resumed), IsOk());
      std::vector<int32_t> got = h.RunToCompletion(nullptr, /*first_index=*/k)[r.id];
      EXPECT_THAT(got, ElementsAreArray(rest)) << "variant " << variant << " k " << k;
      EXPECT_EQ(h.allocator.num_free(), 64);
      // Prefill on one engine, decode on another.
      Harness prefill(64, {});
      Harness decode(64, {});
      EngineRequest prefill_only = resumed;
      prefill_only.prefill_only = true;
      ASSERT_THAT(prefill.core.Add(prefill_only), IsOk());
      got.clear();
      while (prefill.core.HasWork()) {
        auto events = prefill.core.Step();
        ASSERT_THAT(events.status(), IsOk());
        for (const TokenEvent& ev : *events) {
          EXPECT_EQ(ev.output_index, k);
          got.push_back(ev.token);
          if (ev.finish != FinishReason::kPrefilled) continue;
          ASSERT_EQ(ev.prefilled_blocks.size(),
                    (resumed.prompt.size() + kBlockSize - 1) / kBlockSize);
          auto reserved =
              decode.allocator.Allocate(static_cast<int32_t>(ev.prefilled_blocks.size()));
          ASSERT_THAT(reserved.status(), IsOk());
          decode.backend.CopyKvBlocks(prefill.backend, ev.prefilled_blocks, *reserved);
          EXPECT_TRUE(prefill.core.ReleasePrefilled(ev.request_id));
          ASSERT_THAT(decode.core.AddPrefilled(resumed, *reserved, ev.token), IsOk());
        }
      }
      const std::vector<int32_t> decoded =
          decode.RunToCompletion(nullptr, /*first_index=*/k + 1)[r.id];
      got.insert(got.end(), decoded.begin(), decoded.end());
      EXPECT_THAT(got, ElementsAreArray(rest)) << "disaggregated, variant " << variant << " k " << k;
      EXPECT_EQ(decode.allocator.num_free(), 64);
    }
  }
}

TEST(EngineCoreTest, AResumeNeedsOutputsLeftAndAPrompt) {
  Harness h(64, {});
  EngineRequest r = Greedy("r", {1, 2, 3}, 4);
  r.resumed_outputs = 4;
  EXPECT_THAT(h.core.Validate(r), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("resumed_outputs")));
  r.resumed_outputs = 3;
  EXPECT_THAT(h.core.Validate(r), StatusIs(absl::StatusCode::kInvalidArgument));
  r.resumed_outputs = -1;
  EXPECT_THAT(h.core.Validate(r), StatusIs(absl::StatusCode::kInvalidArgument));
  r.resumed_outputs = 2;
  EXPECT_THAT(h.core.Validate(r), IsOk());
}

TEST(EngineCoreTest, AddPrefilledRejectsBadHandOvers) {
  Harness h(16, {});
  EngineRequest r = Greedy("p", {1, 2, 3, 4, 5}, 4);  // 2 blocks of 4
  auto blocks = h.allocator.Allocate(2);
  ASSERT_THAT(blocks.status(), IsOk());
  EXPECT_THAT(h.core.AddPrefilled(r, {(*blocks)[0]}, 7),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs 2 KV blocks")));
  EXPECT_THAT(h.core.AddPrefilled(r, *blocks, kVocab),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("first token")));
  // Fill the blocks with the prompt's KV, computed by a prefill-only engine.
  Harness prefill(16, {});
  EngineRequest pr = r;
  pr.prefill_only = true;
  ASSERT_THAT(prefill.core.Add(pr), IsOk());
  auto first = prefill.core.Step();
  ASSERT_THAT(first.status(), IsOk());
  ASSERT_EQ(first->size(), 1u);
  ASSERT_EQ((*first)[0].finish, FinishReason::kPrefilled);
  h.backend.CopyKvBlocks(prefill.backend, (*first)[0].prefilled_blocks, *blocks);
  ASSERT_THAT(h.core.AddPrefilled(r, *blocks, 7), IsOk());
  auto more = h.allocator.Allocate(2);
  ASSERT_THAT(more.status(), IsOk());
  EXPECT_THAT(h.core.AddPrefilled(r, *more, 7), StatusIs(absl::StatusCode::kAlreadyExists));
  ASSERT_THAT(h.allocator.Free(*more), IsOk());  // refused blocks stay the caller's
  // The adopted sequence decodes outputs 1..3 and frees its blocks at the end.
  std::vector<int32_t> indices;
  while (h.core.HasWork()) {
    auto events = h.core.Step();
    ASSERT_THAT(events.status(), IsOk());
    for (const TokenEvent& ev : *events) indices.push_back(ev.output_index);
  }
  EXPECT_THAT(indices, ElementsAreArray({1, 2, 3}));
  EXPECT_EQ(h.allocator.num_free(), 16);
}

// A prefill-only request whose first token ends it (max_tokens 1) finishes
// normally and keeps no blocks.
TEST(EngineCoreTest, PrefillOnlyFinishedByItsFirstTokenKeepsNoBlocks) {
  Harness h(16, {});
  EngineRequest r = Greedy("one", {1, 2, 3, 4, 5, 6}, 1);
  r.prefill_only = true;
  ASSERT_THAT(h.core.Add(r), IsOk());
  std::map<std::string, FinishReason> reasons;
  h.RunToCompletion(&reasons);
  EXPECT_EQ(reasons["one"], FinishReason::kLength);
  EXPECT_EQ(h.core.prefilled_blocks_held(), 0);
  EXPECT_EQ(h.allocator.num_free(), 16);
}

// The load figures a worker reports: prompt tokens still to compute, and the
// context of sequences past their prompt; what the last step did.
TEST(EngineCoreTest, StatsCountQueuedPromptTokensAndBatchContext) {
  EngineOptions options;
  options.max_batch_tokens = 10;
  Harness h(64, options);
  ASSERT_THAT(h.core.Add(Greedy("a", RandomPromptOf(12), 5)), IsOk());
  ASSERT_THAT(h.core.Add(Greedy("b", RandomPromptOf(3), 5)), IsOk());
  EXPECT_EQ(h.core.stats().queued_prefill_tokens, 15);
  ASSERT_THAT(h.core.Step().status(), IsOk());  // a: 10 of 12
  EXPECT_EQ(h.core.stats().last_step_prefill_tokens, 10);
  EXPECT_EQ(h.core.stats().queued_prefill_tokens, 5);
  ASSERT_THAT(h.core.Step().status(), IsOk());  // a: 2 more (first token), b: 3
  EXPECT_EQ(h.core.stats().queued_prefill_tokens, 0);
  EXPECT_EQ(h.core.stats().batch_context_tokens, 15);
  ASSERT_THAT(h.core.Step().status(), IsOk());  // one decode token each
  EXPECT_EQ(h.core.stats().last_step_prefill_tokens, 0);
  EXPECT_EQ(h.core.stats().last_step_decode_sequences, 2);
  EXPECT_EQ(h.core.stats().batch_context_tokens, 17);
}

TEST(EngineCoreTest, StatsSayWhatTheFirstWaitingSequenceNeedsToStart) {
  // 16 blocks of kBlockSize tokens; one request runs at a time. "a" (prompt
  // 40, chunks of 32) runs and "b" (prompt 30) waits: its first chunk needs
  // 8 blocks, more than the 6 "a" leaves.
  EngineOptions options;
  options.max_batch_tokens = 32;
  options.max_running = 1;
  Harness h(16, options);
  EXPECT_EQ(h.core.stats().waiting_head_blocks, 0);
  ASSERT_THAT(h.core.Add(Greedy("a", RandomPromptOf(40), 2)), IsOk());
  ASSERT_THAT(h.core.Add(Greedy("b", RandomPromptOf(30), 2)), IsOk());
  EXPECT_EQ(h.core.stats().waiting_head_blocks, 32 / kBlockSize);
  ASSERT_THAT(h.core.Step().status(), IsOk());
  ASSERT_THAT(h.core.Step().status(), IsOk());
  const EngineStats stats = h.core.stats();
  ASSERT_EQ(stats.waiting, 1);
  EXPECT_EQ(stats.waiting_head_blocks, (30 + kBlockSize - 1) / kBlockSize);
  EXPECT_EQ(stats.blocks_free, 16 - 40 / kBlockSize);
}

TEST(EngineCoreTest, StopTokenEndsTheRequestAndIsReturned) {
  Harness h(64, {});
  const auto expected = ExpectedGreedy(h.backend, {9, 8, 7}, 10);
  EngineRequest r = Greedy("s", {9, 8, 7}, 10);
  r.stop_token_ids = {expected[3]};
  // The stop token may appear earlier in the continuation; find its first use.
  const auto first = std::find(expected.begin(), expected.end(), expected[3]) - expected.begin();
  ASSERT_THAT(h.core.Add(r), IsOk());
  std::map<std::string, FinishReason> reasons;
  auto out = h.RunToCompletion(&reasons);
  EXPECT_EQ(static_cast<int64_t>(out["s"].size()), first + 1);
  EXPECT_EQ(reasons["s"], FinishReason::kStop);
  EXPECT_EQ(h.allocator.num_free(), 64);
}

TEST(EngineCoreTest, AbortFreesBlocksOfRunningAndWaitingRequests) {
  EngineOptions options;
  options.max_running = 1;
  Harness h(64, options);
  ASSERT_THAT(h.core.Add(Greedy("run", {1, 2, 3, 4, 5, 6}, 100)), IsOk());
  ASSERT_THAT(h.core.Add(Greedy("wait", {1, 2}, 100)), IsOk());
  ASSERT_THAT(h.core.Step().status(), IsOk());
  EXPECT_EQ(h.core.stats().running, 1);
  EXPECT_EQ(h.core.stats().waiting, 1);
  EXPECT_LT(h.allocator.num_free(), 64);
  EXPECT_TRUE(h.core.Abort("run"));
  EXPECT_TRUE(h.core.Abort("wait"));
  EXPECT_FALSE(h.core.Abort("wait"));
  EXPECT_FALSE(h.core.HasWork());
  EXPECT_EQ(h.allocator.num_free(), 64);
}

TEST(EngineCoreTest, ValidationErrors) {
  Harness h(8, {}, /*max_model_len=*/64);
  EXPECT_THAT(h.core.Add(Greedy("e", {}, 4)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no tokens")));
  EXPECT_THAT(h.core.Add(Greedy("v", {1, kVocab}, 4)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside the vocabulary")));
  EXPECT_THAT(h.core.Add(Greedy("m", {1}, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_tokens")));
  EXPECT_THAT(h.core.Add(Greedy("w", std::vector<int32_t>(60, 1), 5)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("context window")));
  // 8 blocks of 4 tokens hold 32 positions.
  EXPECT_THAT(h.core.Add(Greedy("k", std::vector<int32_t>(30, 1), 5)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("KV blocks")));
  ASSERT_THAT(h.core.Add(Greedy("ok", {1}, 1)), IsOk());
  EXPECT_THAT(h.core.Add(Greedy("ok", {1}, 1)), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_FALSE(h.core.HasWork() && h.core.stats().waiting != 1);
}

TEST(EngineCoreTest, ContextWindowEndsGenerationWithLength) {
  Harness h(64, {}, /*max_model_len=*/10);
  ASSERT_THAT(h.core.Add(Greedy("c", {1, 2, 3, 4, 5, 6, 7, 8}, 2)), IsOk());
  std::map<std::string, FinishReason> reasons;
  auto out = h.RunToCompletion(&reasons);
  EXPECT_EQ(out["c"].size(), 2u);
  EXPECT_EQ(reasons["c"], FinishReason::kLength);
}

}  // namespace
}  // namespace trident::engine

namespace trident::engine {
namespace {

TEST(EngineCoreShortOfBlocksTest, BlocksHeldElsewhereStepNothingWithoutAnError) {
  Harness h(4, {});
  auto held = h.allocator.Allocate(3);  // A KV reservation, say.
  ASSERT_THAT(held.status(), IsOk());
  ASSERT_THAT(h.core.Add(Greedy("r", {1, 2, 3, 4, 5, 6, 7, 8}, 4)), IsOk());  // 2 blocks first

  auto events = h.core.Step();
  ASSERT_THAT(events.status(), IsOk());
  EXPECT_TRUE(events->empty());
  EXPECT_TRUE(h.core.short_of_blocks());

  ASSERT_THAT(h.allocator.Free(*held), IsOk());
  std::map<std::string, FinishReason> reasons;
  const auto out = h.RunToCompletion(&reasons);
  EXPECT_FALSE(h.core.short_of_blocks());
  EXPECT_THAT(out.at("r"),
              ElementsAreArray(ExpectedGreedy(h.backend, {1, 2, 3, 4, 5, 6, 7, 8}, 4)));
  EXPECT_EQ(reasons.at("r"), FinishReason::kLength);
}

TEST(EngineCoreShortOfBlocksTest, ANewerHandedOverSequenceGivesUpItsBlocksForTheOldest) {
  Harness h(4, {});
  const std::vector<int32_t> oldest_prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_THAT(h.core.Add(Greedy("oldest", oldest_prompt, 4)), IsOk());  // Needs 2 blocks.
  // A prompt handed over by a prefill worker (1 block) arrives after it.
  const std::vector<int32_t> newer_prompt = {9, 10, 11, 12};
  Harness prefill(4, {});
  EngineRequest pr = Greedy("newer", newer_prompt, 3);
  pr.prefill_only = true;
  ASSERT_THAT(prefill.core.Add(pr), IsOk());
  auto first = prefill.core.Step();
  ASSERT_THAT(first.status(), IsOk());
  ASSERT_EQ((*first)[0].finish, FinishReason::kPrefilled);
  const int32_t first_token = (*first)[0].token;
  auto blocks = h.allocator.Allocate(1);
  ASSERT_THAT(blocks.status(), IsOk());
  h.backend.CopyKvBlocks(prefill.backend, (*first)[0].prefilled_blocks, *blocks);
  ASSERT_THAT(h.core.AddPrefilled(Greedy("newer", newer_prompt, 3), *blocks, first_token), IsOk());
  auto held = h.allocator.Allocate(2);  // Two blocks reserved elsewhere: 1 free.
  ASSERT_THAT(held.status(), IsOk());

  // The oldest runs: the newer sequence's block was freed for it.
  auto events = h.core.Step();
  ASSERT_THAT(events.status(), IsOk());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].request_id, "oldest");
  EXPECT_EQ(h.core.stats().preemptions_total, 1);

  // Once the reservation is gone both finish; the newer one, recomputed,
  // continues exactly as it would have from its handed-over KV.
  ASSERT_THAT(h.allocator.Free(*held), IsOk());
  std::map<std::string, std::vector<int32_t>> out;
  out["oldest"].push_back((*events)[0].token);
  out["newer"].push_back(first_token);
  while (h.core.HasWork()) {
    auto step = h.core.Step();
    ASSERT_THAT(step.status(), IsOk());
    for (const TokenEvent& ev : *step) out[ev.request_id].push_back(ev.token);
  }
  EXPECT_THAT(out["oldest"], ElementsAreArray(ExpectedGreedy(h.backend, oldest_prompt, 4)));
  std::vector<int32_t> history = newer_prompt;
  history.push_back(first_token);
  std::vector<int32_t> want = {first_token};
  for (int32_t t : ExpectedGreedy(h.backend, history, 2)) want.push_back(t);
  EXPECT_THAT(out["newer"], ElementsAreArray(want));
  EXPECT_EQ(h.allocator.num_free(), 4);
}

}  // namespace
}  // namespace trident::engine
