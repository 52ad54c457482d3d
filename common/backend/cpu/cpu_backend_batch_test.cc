// Batch invariance on the real CPU backend (fp32): 64 requests of mixed
// lengths, greedy and seeded sampling, run together through the engine with a
// KV cache small enough to force preemption and a token budget that chunks
// prefills, produce exactly the tokens each produces alone; every KV block
// comes back.

#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/engine/engine_core.h"
#include "common/engine/engine_testing.h"
#include "common/kv/paged_block_allocator.h"
#include "common/model/generate/model_gen.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::backend {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::TestTmpPath;

std::unique_ptr<CpuBackend> Load(const std::string& dir, int64_t kv_bytes) {
  CpuBackendOptions options;
  options.kv_cache_bytes = kv_bytes;
  options.pin_threads = false;
  auto backend = CpuBackend::Create(dir, options);
  EXPECT_THAT(backend.status(), IsOk());
  return backend.ok() ? std::move(*backend) : nullptr;
}

TEST(CpuBackendBatchTest, SixtyFourMixedRequestsMatchTheirSoloRuns) {
  const std::string dir = TestTmpPath("mistral-tiny");
  auto spec = model::generate::PresetSpec("mistral-tiny");
  ASSERT_THAT(spec.status(), IsOk());
  ASSERT_THAT(model::generate::WriteModel(*spec, dir), IsOk());

  const uint32_t seed = 1121;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<engine::EngineRequest> requests;
  for (int i = 0; i < 64; ++i) {
    engine::EngineRequest r;
    r.id = absl::StrCat("r", i);
    const int len = 1 + static_cast<int>(rng() % 60);
    for (int k = 0; k < len; ++k) r.prompt.push_back(static_cast<int32_t>(rng() % 500));
    r.max_tokens = 1 + static_cast<int32_t>(rng() % 24);
    if (i % 2 == 0) {
      r.sampling.temperature = 0;
    } else {
      r.sampling.temperature = 0.9f;
      r.sampling.top_p = 0.95f;
      r.sampling.seed = 5000 + i;
    }
    requests.push_back(r);
  }

  std::map<std::string, std::vector<int32_t>> solo;
  {
    auto backend = Load(dir, int64_t{16} << 20);
    ASSERT_NE(backend, nullptr);
    kv::PagedBlockAllocator allocator(backend->kv_capacity().num_blocks);
    engine::EngineCore core(backend.get(), &allocator, {});
    for (const auto& r : requests) {
      ASSERT_THAT(core.Add(r), IsOk());
      solo[r.id] = engine::DrainTokens(core)[r.id];
      ASSERT_EQ(static_cast<int32_t>(solo[r.id].size()), r.max_tokens);
    }
  }

  // 12 blocks of 16 tokens: far fewer than the batch needs.
  CpuBackendOptions tiny;
  tiny.kv_cache_bytes = 1;
  tiny.pin_threads = false;
  EXPECT_THAT(CpuBackend::Create(dir, tiny).status(),
              ::trident::testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                           ::testing::HasSubstr("holds no block")));
  // K and V x 3 layers x 1 KV head x 16 tokens x head_dim 64 x 4 bytes.
  const int64_t block_bytes = int64_t{2} * 3 * 1 * 16 * 64 * 4;
  auto backend = Load(dir, 12 * block_bytes);
  ASSERT_NE(backend, nullptr);
  ASSERT_EQ(backend->kv_capacity().num_blocks, 12);
  // The pool a transport registers: host memory holding exactly the spec.
  auto memory = backend->kv_memory();
  ASSERT_THAT(memory.status(), IsOk());
  EXPECT_NE(memory->base, nullptr);
  EXPECT_FALSE(memory->device);
  EXPECT_EQ(memory->usable_blocks, 12);
  EXPECT_EQ(memory->bytes, memory->spec.TotalBytes());
  EXPECT_EQ(memory->bytes, static_cast<size_t>(12 * block_bytes));
  kv::PagedBlockAllocator allocator(backend->kv_capacity().num_blocks);
  engine::EngineOptions options;
  options.max_batch_tokens = 48;
  engine::EngineCore core(backend.get(), &allocator, options);
  for (const auto& r : requests) ASSERT_THAT(core.Add(r), IsOk());
  auto together = engine::DrainTokens(core);
  for (const auto& r : requests) {
    EXPECT_THAT(together[r.id], ::testing::ElementsAreArray(solo[r.id])) << r.id;
  }
  std::printf("preemptions: %lld, steps: %lld\n",
              static_cast<long long>(core.stats().preemptions_total),
              static_cast<long long>(core.stats().steps_total));
  EXPECT_GT(core.stats().preemptions_total, 0);
  EXPECT_EQ(allocator.num_free(), allocator.num_total());
}

}  // namespace
}  // namespace trident::backend
