// Prefix caching on the CPU backend, fp32, for every Hugging Face fixture
// model: the greedy tokens of every request are the same with caching on
// and off, in each of the cases that exercise the cache (a shared prefix
// ending mid-block, a hit on the blocks of a sequence still running, 16
// concurrent sequences sharing a prefix, eviction and preemption in a small
// pool), the cached token counts are what the blocks allow, and the pool's
// books balance at the end (every block free or cached, none held).

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/testing/hf_fixture.h"
#include "common/engine/engine_core.h"
#include "common/kv/prefix_caching_block_allocator.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::backend {
namespace {

using ::testing::ElementsAreArray;
using ::trident::testing::IsOk;

constexpr int32_t kBlock = 16;

struct Output {
  std::vector<int32_t> tokens;
  int32_t cached_tokens = -1;
};

// One engine core over its own CPU backend (fp32) and caching allocator.
class Worker {
 public:
  Worker(const std::string& model_dir, bool caching, int64_t kv_cache_bytes) {
    CpuBackendOptions options;
    options.compute_dtype = numeric::DType::kF32;
    options.kv_dtype = numeric::DType::kF32;
    options.kv_cache_bytes = kv_cache_bytes;
    options.kv_block_size = kBlock;
    options.pin_threads = false;
    // One thread: the backends' threads spin between steps, and this test
    // runs beside others on a small machine.
    options.num_threads = 1;
    auto backend = CpuBackend::Create(model_dir, options);
    EXPECT_THAT(backend.status(), IsOk());
    backend_ = std::move(*backend);
    allocator_ = std::make_unique<kv::PrefixCachingBlockAllocator>(
        backend_->kv_capacity().num_blocks);
    engine::EngineOptions eo;
    eo.prefix_caching = caching;
    eo.max_batch_tokens = 96;  // Several steps per wave: later admissions can hit.
    eo.cache_model_identity = model_dir;
    core_ = std::make_unique<engine::EngineCore>(backend_.get(), allocator_.get(), eo);
  }

  void Add(const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens) {
    engine::EngineRequest r;
    r.id = id;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    ASSERT_THAT(core_->Add(std::move(r)), IsOk());
  }
  // Steps `n` times (or until idle).
  void Step(int n = 1 << 30) {
    for (int i = 0; i < n && core_->HasWork(); ++i) {
      auto events = core_->Step();
      ASSERT_THAT(events.status(), IsOk());
      for (const engine::TokenEvent& ev : *events) {
        Output& o = out_[ev.request_id];
        if (ev.output_index == 0) o.cached_tokens = ev.cached_tokens;
        o.tokens.push_back(ev.token);
      }
    }
  }
  const Output& out(const std::string& id) { return out_[id]; }
  const std::map<std::string, Output>& outputs() const { return out_; }
  engine::EngineCore& core() { return *core_; }
  kv::PrefixCachingBlockAllocator& allocator() { return *allocator_; }

 private:
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<kv::PrefixCachingBlockAllocator> allocator_;
  std::unique_ptr<engine::EngineCore> core_;
  std::map<std::string, Output> out_;
};

class PrefixCacheParityTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto fixture = testing::LoadHfFixture(GetParam());
    ASSERT_THAT(fixture.status(), IsOk());
    fixture_ = std::move(*fixture);
  }

  // `n` tokens drawn from the fixture's prompts (valid ids), seeded.
  std::vector<int32_t> Tokens(uint32_t seed, int32_t n) const {
    std::mt19937 rng(seed);
    std::vector<int32_t> out;
    while (static_cast<int32_t>(out.size()) < n) {
      const auto& ids = fixture_.prompts[rng() % fixture_.prompts.size()].ids;
      out.push_back(ids[rng() % ids.size()]);
    }
    return out;
  }
  static std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  // Checks every request's tokens agree between the runs and the pool.
  static void ExpectSameTokensAndBalancedPool(Worker& on, Worker& off) {
    ASSERT_EQ(on.outputs().size(), off.outputs().size());
    for (const auto& [id, o] : off.outputs()) {
      EXPECT_THAT(on.outputs().at(id).tokens, ElementsAreArray(o.tokens)) << id;
    }
    EXPECT_THAT(on.core().CheckKvInvariants(), IsOk());
    EXPECT_EQ(on.allocator().num_used(), 0);
    EXPECT_EQ(off.allocator().num_cached(), 0);
  }

  testing::HfFixture fixture_;
};

TEST_P(PrefixCacheParityTest, PrefixEndingMidBlockAndARunningSequencesBlocks) {
  Worker on(fixture_.model_dir, true, 8 << 20), off(fixture_.model_dir, false, 8 << 20);
  const auto system = Tokens(1, 3 * kBlock + 5);  // Ends mid-block.
  for (Worker* w : {&on, &off}) {
    w->Add("first", Concat(system, Tokens(2, 7)), 24);
    w->Step(3);  // "first" is prefilled and decoding.
    w->Add("running-hit", Concat(system, Tokens(3, 4)), 12);
    w->Step();
    w->Add("after", Concat(system, Tokens(4, 9)), 12);
    w->Step();
  }
  EXPECT_EQ(on.out("first").cached_tokens, 0);
  EXPECT_EQ(on.out("running-hit").cached_tokens, 3 * kBlock);
  EXPECT_EQ(on.out("after").cached_tokens, 3 * kBlock);
  EXPECT_EQ(off.out("after").cached_tokens, 0);
  ExpectSameTokensAndBalancedPool(on, off);
}

TEST_P(PrefixCacheParityTest, SixteenConcurrentSequencesSharingAPrefix) {
  Worker on(fixture_.model_dir, true, 8 << 20), off(fixture_.model_dir, false, 8 << 20);
  const auto system = Tokens(5, 4 * kBlock);
  for (Worker* w : {&on, &off}) {
    for (int i = 0; i < 16; ++i) {
      w->Add(absl::StrCat("s", i), Concat(system, Tokens(100 + i, 1 + i)), 10);
    }
    w->Step();
  }
  int hits = 0;
  for (int i = 0; i < 16; ++i) hits += on.out(absl::StrCat("s", i)).cached_tokens == 4 * kBlock;
  std::printf("%s: %d of 16 sequences found the shared 64-token prefix cached\n",
              GetParam().c_str(), hits);
  EXPECT_GE(hits, 12);  // Those admitted after the first prefill step.
  ExpectSameTokensAndBalancedPool(on, off);
}

TEST_P(PrefixCacheParityTest, EvictionAndPreemptionInASmallPool) {
  const uint32_t seed = 20261127;
  std::printf("seed %u\n", seed);
  // A pool of ~24 blocks: a wave's working set does not fit.
  Worker probe(fixture_.model_dir, true, 8 << 20);
  const int64_t block_bytes = (int64_t{8} << 20) / probe.allocator().num_total();
  const int64_t small = 24 * block_bytes;
  Worker on(fixture_.model_dir, true, small), off(fixture_.model_dir, false, small);
  std::printf("%s: pool of %d blocks\n", GetParam().c_str(), on.allocator().num_total());
  const std::vector<std::vector<int32_t>> systems = {Tokens(6, 2 * kBlock + 3),
                                                     Tokens(7, 5 * kBlock), Tokens(8, kBlock)};
  std::mt19937 rng(seed);
  for (int wave = 0; wave < 4; ++wave) {
    std::vector<std::pair<std::vector<int32_t>, int32_t>> wave_requests;
    for (int i = 0; i < 6; ++i) {
      wave_requests.emplace_back(Concat(systems[rng() % 3], Tokens(rng(), 1 + rng() % 20)),
                                 8 + static_cast<int32_t>(rng() % 100));
    }
    for (Worker* w : {&on, &off}) {
      for (int i = 0; i < 6; ++i) {
        w->Add(absl::StrCat("w", wave, "r", i), wave_requests[i].first, wave_requests[i].second);
      }
      w->Step();
    }
  }
  const engine::EngineStats s = on.core().stats();
  std::printf("%s: %lld evictions, %lld preemptions, %lld of %lld prompt tokens cached\n",
              GetParam().c_str(), static_cast<long long>(on.allocator().num_evicted()),
              static_cast<long long>(s.preemptions_total),
              static_cast<long long>(s.prefix_cache_hits_total),
              static_cast<long long>(s.prefix_cache_queries_total));
  EXPECT_GT(on.allocator().num_evicted(), 0);
  EXPECT_GT(s.preemptions_total, 0);
  EXPECT_GT(s.prefix_cache_hits_total, 0);
  ExpectSameTokensAndBalancedPool(on, off);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PrefixCacheParityTest,
                         ::testing::Values("llama3-tiny", "qwen2-tiny", "mistral-tiny"),
                         [](const auto& info) { return testing::FixtureTestName(info.param); });

}  // namespace
}  // namespace trident::backend
