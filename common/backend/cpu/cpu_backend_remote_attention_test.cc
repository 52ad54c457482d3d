// CPU-resident sequences on the CPU backend: a sequence whose KV an
// attention service holds (here FakeRemoteAttention, in process) decodes to
// the same logits as one resident in the backend's cache, alone and mixed in
// one batch with resident ones, and as a pipelined second sub-batch; a dead
// service fails the step with a status that names it.

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cpu/cpu_backend.h"
#include "common/backend/model_backend.h"
#include "common/backend/testing/offload_scenario.h"
#include "common/engine/engine_core.h"
#include "common/kv/paged_block_allocator.h"
#include "common/model/generate/model_gen.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "common/transport/attention/fake_remote_attention.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::backend {
namespace {

using transport::attention::FakeRemoteAttention;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

class CpuBackendRemoteAttentionTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = ::trident::testing::TestTmpPath(GetParam());
    auto spec = model::generate::PresetSpec(GetParam());
    ASSERT_THAT(spec.status(), IsOk());
    ASSERT_THAT(model::generate::WriteModel(*spec, dir_), IsOk());
    auto backend = MakeBackend(int64_t{8} << 20);
    ASSERT_THAT(backend.status(), IsOk());
    backend_ = *std::move(backend);
    const model::ModelConfig& c = backend_->config();
    fake_ = std::make_unique<FakeRemoteAttention>(c.num_hidden_layers, c.num_attention_heads,
                                                  c.num_key_value_heads, c.head_dim);
  }

  // A backend of the test's model with a KV cache of `kv_cache_bytes`.
  absl::StatusOr<std::unique_ptr<CpuBackend>> MakeBackend(int64_t kv_cache_bytes) const {
    CpuBackendOptions options;
    options.kv_cache_bytes = kv_cache_bytes;
    options.pin_threads = false;
    options.num_threads = 1;
    return CpuBackend::Create(dir_, options);
  }

  // Runs one step of `batch`, returning one logits row per sequence.
  std::vector<std::vector<float>> Step(const std::vector<StepSequence>& batch) {
    std::vector<float> logits(batch.size() * backend_->vocab_size());
    EXPECT_THAT(backend_->Forward(batch, logits.data()), IsOk());
    std::vector<std::vector<float>> rows;
    for (size_t i = 0; i < batch.size(); ++i) {
      rows.emplace_back(logits.begin() + i * backend_->vocab_size(),
                        logits.begin() + (i + 1) * backend_->vocab_size());
    }
    return rows;
  }

  static int32_t Argmax(const std::vector<float>& row) {
    return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  }

  // Copies positions [0, n) of a sequence in `blocks` out of the backend's
  // cache into the fake (a migration to the service).
  void Migrate(absl::Span<const int32_t> blocks, int32_t n, uint64_t handle) {
    auto memory = backend_->kv_memory();
    ASSERT_THAT(memory.status(), IsOk());
    testing::MigrateToFake(static_cast<const char*>(memory->base), memory->spec, blocks, n, handle,
                           *fake_);
  }

  std::string dir_;
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<FakeRemoteAttention> fake_;
};

TEST_P(CpuBackendRemoteAttentionTest, ARemoteSequenceDecodesAsAResidentOneDoes) {
  const std::vector<int32_t> prompt = {5,  17, 99, 3,  250, 42, 7,  8,  9,
                                       10, 11, 12, 13, 14,  15, 16, 77, 78};
  const int32_t n = static_cast<int32_t>(prompt.size());
  // Two copies of the same sequence: A stays resident (blocks 0-2), B is
  // prefilled into blocks 3-5 and then migrated to the service.
  const std::vector<int32_t> blocks_a = {0, 1, 2}, blocks_b = {3, 4, 5};
  auto prefill =
      Step({StepSequence{.tokens = prompt, .block_table = blocks_a, .want_logits = true},
            StepSequence{.tokens = prompt, .block_table = blocks_b, .want_logits = true}});
  ASSERT_EQ(prefill[0], prefill[1]);
  const uint64_t handle = fake_->Admit();
  Migrate(blocks_b, n, handle);
  int32_t token = Argmax(prefill[0]);
  for (int32_t step = 0; step < 20; ++step) {
    const int32_t position = n + step;
    std::vector<int32_t> tokens = {token};
    auto rows = Step({StepSequence{.tokens = tokens,
                                   .start_position = position,
                                   .block_table = blocks_a,
                                   .want_logits = true},
                      StepSequence{.tokens = tokens,
                                   .start_position = position,
                                   .want_logits = true,
                                   .remote = {fake_.get(), handle}}});
    for (size_t j = 0; j < rows[0].size(); ++j) {
      ASSERT_NEAR(rows[1][j], rows[0][j], 1e-4) << "step " << step << " logit " << j;
    }
    ASSERT_EQ(Argmax(rows[1]), Argmax(rows[0])) << step;
    token = Argmax(rows[0]);
  }
  EXPECT_EQ(fake_->requests(), 20 * backend_->config().num_hidden_layers);
}

TEST_P(CpuBackendRemoteAttentionTest, APipelinedSubBatchDecodesAsTheWholeBatchDoes) {
  const std::vector<int32_t> prompt = {5,  17, 99, 3,  250, 42, 7,  8,  9,
                                       10, 11, 12, 13, 14,  15, 16, 77, 78};
  const int32_t n = static_cast<int32_t>(prompt.size());
  // Three copies: A resident, B and C at the service; C alone in the second
  // sub-batch, listed first so that its logits must be put back in place.
  const std::vector<int32_t> blocks_a = {0, 1, 2}, blocks_b = {3, 4, 5}, blocks_c = {6, 7, 8};
  auto prefill = Step({StepSequence{.tokens = prompt, .block_table = blocks_a, .want_logits = true},
                       StepSequence{.tokens = prompt, .block_table = blocks_b},
                       StepSequence{.tokens = prompt, .block_table = blocks_c}});
  const uint64_t hb = fake_->Admit(), hc = fake_->Admit();
  Migrate(blocks_b, n, hb);
  Migrate(blocks_c, n, hc);
  ASSERT_TRUE(backend_->supports_pipelining());
  const RemoteAttentionTiming before = backend_->remote_attention_timing();
  int32_t token = Argmax(prefill[0]);
  for (int32_t step = 0; step < 10; ++step) {
    const int32_t position = n + step;
    std::vector<int32_t> tokens = {token};
    auto rows = Step({StepSequence{.tokens = tokens,
                                   .start_position = position,
                                   .want_logits = true,
                                   .remote = {fake_.get(), hc},
                                   .sub_batch = 1},
                      StepSequence{.tokens = tokens,
                                   .start_position = position,
                                   .block_table = blocks_a,
                                   .want_logits = true},
                      StepSequence{.tokens = tokens,
                                   .start_position = position,
                                   .want_logits = true,
                                   .remote = {fake_.get(), hb}}});
    for (size_t j = 0; j < rows[1].size(); ++j) {
      ASSERT_NEAR(rows[0][j], rows[1][j], 1e-4) << "step " << step << " logit " << j;
      ASSERT_NEAR(rows[2][j], rows[1][j], 1e-4) << "step " << step << " logit " << j;
    }
    token = Argmax(rows[1]);
  }
  // Two requests per layer (one per sub-batch), each timed.
  const int32_t layers = backend_->config().num_hidden_layers;
  const RemoteAttentionTiming after = backend_->remote_attention_timing();
  EXPECT_EQ(fake_->requests(), 2 * 10 * layers);
  EXPECT_EQ(after.requests - before.requests, 2 * 10 * layers);
  EXPECT_GE(after.round_trip_seconds - before.round_trip_seconds,
            after.exposed_seconds - before.exposed_seconds);
  // A second sub-batch alone is a plain batch.
  std::vector<int32_t> tokens = {token};
  auto alone = Step({StepSequence{.tokens = tokens,
                                  .start_position = n + 10,
                                  .want_logits = true,
                                  .remote = {fake_.get(), hc},
                                  .sub_batch = 1}});
  EXPECT_EQ(alone.size(), 1u);
  EXPECT_EQ(fake_->requests(), 2 * 10 * layers + layers);
}

TEST_P(CpuBackendRemoteAttentionTest, OnlyCpuResidentSequencesFormTheSecondSubBatch) {
  const std::vector<int32_t> prompt = {1, 2, 3};
  const std::vector<int32_t> blocks = {0};
  std::vector<float> logits(backend_->vocab_size());
  EXPECT_THAT(
      backend_->Forward(
          {StepSequence{
              .tokens = prompt, .block_table = blocks, .want_logits = true, .sub_batch = 1}},
          logits.data()),
      StatusIs(absl::StatusCode::kInvalidArgument));
  const uint64_t handle = fake_->Admit();
  std::vector<int32_t> token = {4};
  EXPECT_THAT(backend_->Forward({StepSequence{.tokens = token,
                                              .start_position = 0,
                                              .want_logits = true,
                                              .remote = {fake_.get(), handle},
                                              .sub_batch = 2}},
                                logits.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_P(CpuBackendRemoteAttentionTest, ADeadServiceFailsTheStepNamingIt) {
  const std::vector<int32_t> prompt = {1, 2, 3};
  const std::vector<int32_t> blocks = {0};
  Step({StepSequence{.tokens = prompt, .block_table = blocks, .want_logits = true}});
  const uint64_t handle = fake_->Admit();
  Migrate(blocks, 3, handle);
  fake_->Kill();
  const std::vector<int32_t> token = {4};
  std::vector<float> logits(backend_->vocab_size());
  const std::vector<StepSequence> batch = {StepSequence{
      .tokens = token, .start_position = 3, .want_logits = true, .remote = {fake_.get(), handle}}};
  absl::Status status = backend_->Forward(batch, logits.data());
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(FailedRemoteAttention(status), fake_.get());
  EXPECT_EQ(FailedRemoteAttention(absl::UnavailableError("other")), nullptr);
}

TEST_P(CpuBackendRemoteAttentionTest, ARemoteSequenceDecodesOneTokenAStep) {
  const std::vector<int32_t> two = {4, 5};
  std::vector<float> logits(2 * backend_->vocab_size());
  const std::vector<StepSequence> batch = {StepSequence{.tokens = two,
                                                        .start_position = 3,
                                                        .want_logits = true,
                                                        .remote = {fake_.get(), fake_->Admit()}}};
  EXPECT_THAT(backend_->Forward(batch, logits.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("one token")));
}

// Through the engine: requests decode for a while resident, then move to
// the service (their KV copied, their blocks freed), then the service dies
// and they are recomputed here; every request ends with the tokens it has
// when it never leaves, and every block comes back.
TEST_P(CpuBackendRemoteAttentionTest, TheEngineMovesSequencesOutAndBackWithTheSameTokens) {
  const auto requests = testing::OffloadScenarioRequests();
  const auto migrate = [&](absl::Span<const int32_t> blocks, int32_t n, uint64_t handle) {
    Migrate(blocks, n, handle);
  };
  const auto resident = testing::RunOffloadScenario(*backend_, *fake_, requests, false, migrate);
  const auto moved = testing::RunOffloadScenario(*backend_, *fake_, requests, true, migrate);
  for (const auto* run : {&resident, &moved}) {
    EXPECT_EQ(run->step_errors, 0);
    EXPECT_EQ(run->blocks_leaked, 0);
  }
  EXPECT_EQ(moved.moves_failed, 0);
  EXPECT_EQ(moved.remote_at_move, 4);
  EXPECT_EQ(moved.stats.remote_moves_total, 4);
  EXPECT_EQ(moved.stats.remote_demoted_total, 4);
  EXPECT_EQ(moved.released, 4);
  for (const auto& r : requests) {
    EXPECT_EQ(moved.tokens.at(r.id), resident.tokens.at(r.id)) << r.id;
    EXPECT_EQ(resident.tokens.at(r.id).size(), 24u);
  }
}

// A sequence placed at a service at admission (its prompt written there,
// AddPrefilled with a remote placement) need not fit this worker's cache:
// it decodes there with the tokens a resident run gives, and when its
// service dies it cannot come back, so it ends with an error instead of
// waiting forever for blocks.
TEST_P(CpuBackendRemoteAttentionTest, APlacedSequenceNeedNotFitTheCacheAndEndsIfItsServiceDies) {
  engine::EngineRequest r;
  r.id = "placed";
  for (int32_t t = 0; t < 100; ++t) r.prompt.push_back(1 + (7 * t) % 200);
  r.max_tokens = 12;
  r.sampling.temperature = 0;
  // Reference: resident in a cache that holds it; its prompt's KV goes to
  // the fake after the prefill step, as a prefill worker would write it.
  kv::PagedBlockAllocator big(backend_->kv_capacity().num_blocks);
  engine::EngineCore reference(backend_.get(), &big, {});
  ASSERT_THAT(reference.Add(r), IsOk());
  std::vector<int32_t> expected;
  const uint64_t handle = fake_->Admit();
  while (reference.HasWork()) {
    auto events = reference.Step();
    ASSERT_THAT(events.status(), IsOk());
    for (const auto& ev : *events) expected.push_back(ev.token);
    if (expected.size() == 1) {
      const auto candidates = reference.OffloadCandidates();
      ASSERT_EQ(candidates.size(), 1u);
      Migrate(candidates[0].blocks, candidates[0].num_computed, handle);
    }
  }
  ASSERT_EQ(expected.size(), 12u);

  // A backend of the same model whose 128 KiB cache holds < 112 tokens.
  auto small_backend = MakeBackend(int64_t{128} << 10);
  ASSERT_THAT(small_backend.status(), IsOk());
  const int32_t blocks = (*small_backend)->kv_capacity().num_blocks;
  ASSERT_LT(blocks * (*small_backend)->kv_capacity().block_size, 112);
  kv::PagedBlockAllocator small(blocks);
  engine::EngineCore core(small_backend->get(), &small, {});
  int released = 0;
  core.set_remote_listener([&](const std::string&, const RemoteKv&) { ++released; });
  EXPECT_THAT(core.Add(r), StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_THAT(core.AddPrefilled(r, {}, expected[0], RemoteKv{fake_.get(), handle}, "cpu0"), IsOk());
  EXPECT_EQ(core.stats().remote_placed_total, 1);
  std::vector<int32_t> tokens = {expected[0]};
  for (int step = 0; step < 5; ++step) {
    auto events = core.Step();
    ASSERT_THAT(events.status(), IsOk());
    for (const auto& ev : *events) tokens.push_back(ev.token);
  }
  EXPECT_EQ(tokens, std::vector<int32_t>(expected.begin(), expected.begin() + 6));
  fake_->Kill();
  auto events = core.Step();
  ASSERT_THAT(events.status(), IsOk());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].request_id, "placed");
  EXPECT_EQ((*events)[0].finish, engine::FinishReason::kError);
  EXPECT_FALSE(core.HasWork());
  EXPECT_EQ(released, 1);
  EXPECT_EQ(small.num_free(), blocks);
}

INSTANTIATE_TEST_SUITE_P(Models, CpuBackendRemoteAttentionTest,
                         ::testing::Values("llama3-tiny", "qwen2-tiny", "mistral-tiny"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace trident::backend
