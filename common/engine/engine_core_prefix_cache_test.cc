// Prefix caching in the engine core, on the fake backend (whose logits read
// the whole history back through the block table, so a wrong shared block
// changes the tokens): every request's output equals the model's own
// continuation, with the prefix's tokens counted as cached and not
// recomputed, and the pool's books balanced at the end.

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/fake_model_backend.h"
#include "common/engine/engine_testing.h"
#include "common/engine/engine_core.h"
#include "common/kv/prefix_caching_block_allocator.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::engine {
namespace {

using ::testing::ElementsAreArray;
using ::trident::testing::IsOk;

constexpr int32_t kVocab = 97;
constexpr int32_t kBlockSize = 4;

struct Harness {
  explicit Harness(int32_t num_blocks, EngineOptions options = {})
      : backend(kVocab, num_blocks, kBlockSize, 512),
        allocator(num_blocks),
        core(&backend, &allocator, options) {}

  struct Result {
    std::vector<int32_t> tokens;
    int32_t cached_tokens = -1;
  };
  // Steps until idle.
  std::map<std::string, Result> Run() {
    std::map<std::string, Result> out;
    for (int guard = 0; core.HasWork() && guard < 100000; ++guard) {
      auto events = core.Step();
      EXPECT_THAT(events.status(), IsOk());
      if (!events.ok()) break;
      for (const TokenEvent& ev : *events) {
        Result& r = out[ev.request_id];
        if (ev.output_index == 0) r.cached_tokens = ev.cached_tokens;
        r.tokens.push_back(ev.token);
      }
    }
    EXPECT_FALSE(core.HasWork());
    return out;
  }
  // Adds and runs one request.
  Result RunOne(EngineRequest request) {
    const std::string id = request.id;
    EXPECT_THAT(core.Add(std::move(request)), IsOk());
    return Run()[id];
  }

  backend::FakeModelBackend backend;
  kv::PrefixCachingBlockAllocator allocator;
  EngineCore core;
};

std::vector<int32_t> Prompt(uint32_t seed, int32_t len) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, kVocab - 1);
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = tok(rng);
  return p;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(EngineCorePrefixCacheTest, SharedPrefixEndingMidBlockReusesItsWholeBlocks) {
  Harness h(64);
  const std::vector<int32_t> system = Prompt(1, 10);  // 2 whole blocks + 2 tokens.
  const auto first = Concat(system, {5, 6, 7});
  const auto second = Concat(system, {8, 9});
  Harness::Result a = h.RunOne(Greedy("a", first, 6));
  EXPECT_EQ(a.cached_tokens, 0);
  const int64_t before = h.backend.tokens_processed();
  Harness::Result b = h.RunOne(Greedy("b", second, 6));
  EXPECT_THAT(b.tokens, ElementsAreArray(ExpectedGreedy(h.backend, second, 6)));
  // The two whole blocks of the shared 10 tokens; the partial third is not
  // shared.
  EXPECT_EQ(b.cached_tokens, 8);
  // Prefill computed only the 4 uncached prompt tokens, then 5 decode steps.
  EXPECT_EQ(h.backend.tokens_processed() - before, 4 + 5);
  const EngineStats s = h.core.stats();
  EXPECT_EQ(s.prefix_cache_queries_total, 13 + 12);
  EXPECT_EQ(s.prefix_cache_hits_total, 8);
  EXPECT_THAT(h.core.CheckKvInvariants(), IsOk());
  EXPECT_EQ(h.allocator.num_used(), 0);
}

TEST(EngineCorePrefixCacheTest, IdenticalBlockAlignedPromptRecomputesItsLastBlock) {
  Harness h(64);
  const auto prompt = Prompt(2, 12);  // Exactly 3 blocks.
  h.RunOne(Greedy("a", prompt, 4));
  Harness::Result b = h.RunOne(Greedy("b", prompt, 4));
  // At most prompt - 1 tokens come from the cache, in whole blocks: the last
  // block runs again to give the first token's logits.
  EXPECT_EQ(b.cached_tokens, 8);
  EXPECT_THAT(b.tokens, ElementsAreArray(ExpectedGreedy(h.backend, prompt, 4)));
}

TEST(EngineCorePrefixCacheTest, SecondTurnReusesTheFirstTurnsPromptAndAnswer) {
  Harness h(64);
  const auto turn1 = Prompt(3, 9);
  Harness::Result a = h.RunOne(Greedy("t1", turn1, 8));
  // The next turn's prompt: the history, the answer and a new message.
  const auto turn2 = Concat(Concat(turn1, a.tokens), {11, 12, 13});
  Harness::Result b = h.RunOne(Greedy("t2", turn2, 5));
  // 9 + 8 = 17 tokens of history, of which the answer's last token's KV was
  // never computed: 16 positions written, 4 whole blocks.
  EXPECT_EQ(b.cached_tokens, 16);
  EXPECT_THAT(b.tokens, ElementsAreArray(ExpectedGreedy(h.backend, turn2, 5)));
}

TEST(EngineCorePrefixCacheTest, HitsBlocksOfASequenceStillRunning) {
  EngineOptions options;
  options.max_batch_tokens = 64;
  Harness h(64, options);
  const auto system = Prompt(4, 16);
  const auto first = Concat(system, {1});
  const auto second = Concat(system, {2, 3});
  ASSERT_THAT(h.core.Add(Greedy("a", first, 30)), IsOk());
  ASSERT_THAT(h.core.Step().status(), IsOk());  // "a" prefilled; decoding on.
  ASSERT_THAT(h.core.Step().status(), IsOk());
  ASSERT_THAT(h.core.Add(Greedy("b", second, 10)), IsOk());
  auto out = h.Run();
  EXPECT_EQ(out["b"].cached_tokens, 16);
  EXPECT_THAT(out["b"].tokens, ElementsAreArray(ExpectedGreedy(h.backend, second, 10)));
  EXPECT_EQ(out["a"].tokens.size(), 28u);  // 2 tokens came from the steps above.
  EXPECT_THAT(h.core.CheckKvInvariants(), IsOk());
  EXPECT_EQ(h.allocator.num_used(), 0);
}

TEST(EngineCorePrefixCacheTest, SixteenConcurrentSequencesSharingAPrefix) {
  EngineOptions options;
  options.max_batch_tokens = 48;  // Admission spreads over several steps.
  Harness h(128, options);
  const auto system = Prompt(5, 24);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 16; ++i) {
    prompts.push_back(Concat(system, Prompt(100 + i, 1 + i % 5)));
    ASSERT_THAT(h.core.Add(Greedy(absl::StrCat("s", i), prompts.back(), 12)), IsOk());
  }
  auto out = h.Run();
  int with_hits = 0;
  for (int i = 0; i < 16; ++i) {
    const auto& r = out[absl::StrCat("s", i)];
    EXPECT_THAT(r.tokens, ElementsAreArray(ExpectedGreedy(h.backend, prompts[i], 12))) << i;
    if (r.cached_tokens == 24) ++with_hits;
  }
  // The first admitted computes the prefix; those admitted in later steps
  // reuse it.
  EXPECT_GE(with_hits, 14);
  EXPECT_THAT(h.core.CheckKvInvariants(), IsOk());
  EXPECT_EQ(h.allocator.num_used(), 0);
}

// Requests arriving together with a new shared prefix: the first computes
// it, the others wait for its blocks (bounded) instead of each computing it,
// and prompts without it go ahead meanwhile.
TEST(EngineCorePrefixCacheTest, ANewSharedPrefixIsComputedOnce) {
  for (int32_t wait_steps : {0, 8}) {
    EngineOptions options;
    options.max_batch_tokens = 24;  // The 40-token prefix takes two steps.
    options.shared_prefix_wait_steps = wait_steps;
    Harness h(128, options);
    const auto system = Prompt(7, 40);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 4; ++i) {
      prompts.push_back(Concat(system, Prompt(200 + i, 3)));
      ASSERT_THAT(h.core.Add(Greedy(absl::StrCat("s", i), prompts.back(), 6)), IsOk());
    }
    const auto other = Prompt(9, 5);
    ASSERT_THAT(h.core.Add(Greedy("other", other, 6)), IsOk());
    auto out = h.Run();
    int computed_prefix = 0;
    for (int i = 0; i < 4; ++i) {
      const auto& r = out[absl::StrCat("s", i)];
      EXPECT_THAT(r.tokens, ElementsAreArray(ExpectedGreedy(h.backend, prompts[i], 6))) << i;
      if (r.cached_tokens < 40) ++computed_prefix;
    }
    EXPECT_THAT(out["other"].tokens, ElementsAreArray(ExpectedGreedy(h.backend, other, 6)));
    std::printf("waiting up to %d steps: %d of 4 requests computed the shared prefix\n",
                wait_steps, computed_prefix);
    if (wait_steps > 0) {
      EXPECT_EQ(computed_prefix, 1);
    } else {
      EXPECT_GT(computed_prefix, 1);  // Without waiting, several compute it.
    }
    EXPECT_THAT(h.core.CheckKvInvariants(), IsOk());
    EXPECT_EQ(h.allocator.num_used(), 0);
  }
}

// A pool far smaller than the working set: cached blocks are evicted for
// new work, preemption recomputes, and every output is still the model's.
TEST(EngineCorePrefixCacheTest, EvictionAndPreemptionUnderPressureKeepOutputs) {
  const uint32_t seed = 20261127;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  Harness h(16);
  std::vector<std::vector<int32_t>> systems = {Prompt(6, 12), Prompt(7, 20), Prompt(8, 8)};
  std::map<std::string, std::vector<int32_t>> prompts;
  for (int wave = 0; wave < 6; ++wave) {
    for (int i = 0; i < 5; ++i) {
      const std::string id = absl::StrCat("w", wave, "r", i);
      prompts[id] = Concat(systems[rng() % 3], Prompt(rng(), 1 + static_cast<int32_t>(rng() % 9)));
      ASSERT_THAT(h.core.Add(Greedy(id, prompts[id], 1 + static_cast<int32_t>(rng() % 30))),
                  IsOk());
    }
    auto out = h.Run();
    for (const auto& [id, r] : out) {
      EXPECT_THAT(r.tokens, ElementsAreArray(ExpectedGreedy(h.backend, prompts[id],
                                                            static_cast<int32_t>(r.tokens.size()))))
          << id;
    }
    ASSERT_THAT(h.core.CheckKvInvariants(), IsOk());
    ASSERT_EQ(h.allocator.num_used(), 0);
  }
  const EngineStats s = h.core.stats();
  EXPECT_GT(h.allocator.num_evicted(), 0);
  EXPECT_GT(s.preemptions_total, 0);
  EXPECT_GT(s.prefix_cache_hits_total, 0);
  std::printf("evicted %lld blocks, %lld preemptions, hits %lld of %lld tokens\n",
              static_cast<long long>(h.allocator.num_evicted()),
              static_cast<long long>(s.preemptions_total),
              static_cast<long long>(s.prefix_cache_hits_total),
              static_cast<long long>(s.prefix_cache_queries_total));
}

TEST(EngineCorePrefixCacheTest, SaltsKeepTenantsApart) {
  Harness h(64);
  const auto prompt = Prompt(9, 20);
  EngineRequest a = Greedy("a", prompt, 3);
  a.cache_salt = "tenant-a";
  h.RunOne(std::move(a));
  EngineRequest b = Greedy("b", prompt, 3);
  b.cache_salt = "tenant-b";
  EXPECT_EQ(h.RunOne(std::move(b)).cached_tokens, 0);
  EngineRequest c = Greedy("c", prompt, 3);
  c.cache_salt = "tenant-a";
  EXPECT_EQ(h.RunOne(std::move(c)).cached_tokens, 16);
}

TEST(EngineCorePrefixCacheTest, OffMatchesNothing) {
  EngineOptions options;
  options.prefix_caching = false;
  Harness h(64, options);
  const auto prompt = Prompt(10, 20);
  h.RunOne(Greedy("a", prompt, 3));
  EXPECT_EQ(h.RunOne(Greedy("b", prompt, 3)).cached_tokens, 0);
  EXPECT_EQ(h.allocator.num_cached(), 0);
  EXPECT_EQ(h.core.stats().prefix_cache_hits_total, 0);
}

// Disaggregated: the decode side publishes a handed-over prompt's blocks,
// and a prefill-only request there reuses them.
TEST(EngineCorePrefixCacheTest, HandedOverPromptIsCachedOnTheDecodeSide) {
  Harness prefill(64), decode(64);
  const auto prompt = Prompt(11, 14);
  EngineRequest p = Greedy("r", prompt, 6);
  p.prefill_only = true;
  auto out = prefill.RunOne(std::move(p));
  ASSERT_EQ(out.tokens.size(), 1u);
  // Move the prompt's KV as a transfer would.
  auto blocks = decode.allocator.Allocate(4);
  ASSERT_THAT(blocks.status(), IsOk());
  std::vector<int32_t> src;
  // The prefill side still holds them until ReleasePrefilled.
  for (int32_t b = 0; b < 64 && src.size() < 4; ++b) {
    if (prefill.allocator.RefCountForTesting(b) > 0) src.push_back(b);
  }
  ASSERT_EQ(src.size(), 4u);
  decode.backend.CopyKvBlocks(prefill.backend, src, *blocks);
  ASSERT_TRUE(prefill.core.ReleasePrefilled("r"));
  ASSERT_THAT(decode.core.AddPrefilled(Greedy("r", prompt, 6), *blocks, out.tokens[0]), IsOk());
  auto decoded = decode.Run();
  EXPECT_THAT(Concat(out.tokens, decoded["r"].tokens),
              ElementsAreArray(ExpectedGreedy(decode.backend, prompt, 6)));
  // Three whole prompt blocks were published on adoption.
  EXPECT_EQ(decode.RunOne(Greedy("again", prompt, 2)).cached_tokens, 12);
  EXPECT_THAT(decode.core.CheckKvInvariants(), IsOk());
  EXPECT_THAT(prefill.core.CheckKvInvariants(), IsOk());
  EXPECT_EQ(prefill.allocator.num_used(), 0);
}

}  // namespace
}  // namespace trident::engine
