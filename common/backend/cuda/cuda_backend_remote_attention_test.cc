// CPU-resident sequences on the CUDA backend: a sequence whose KV an
// attention service holds (here FakeRemoteAttention, in process) decodes to
// the logits of one resident in the GPU's cache (within bf16 rounding: the
// service attends over the same bf16 KV in fp64, the GPU in fp32), alone
// and mixed with resident ones, as a pipelined second sub-batch listed out
// of order, and through the engine with device sampling; a dead service
// fails the step with a status that names it, and no block leaks.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/backend/cuda/cuda_backend.h"
#include "common/backend/model_backend.h"
#include "common/backend/testing/hf_fixture.h"
#include "common/backend/testing/offload_scenario.h"
#include "common/engine/engine_core.h"
#include "common/kv/paged_block_allocator.h"
#include "common/numeric/dtype.h"
#include "common/testing/status_matchers.h"
#include "common/transport/attention/fake_remote_attention.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::backend {
namespace {

using transport::attention::FakeRemoteAttention;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

// Of a logits row's range: the bf16 activations round o differently on the
// two paths (one ulp of bf16 is 2^-8 relative).
constexpr double kTolerance = 2e-2;

class CudaRemoteAttentionTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto fixture = testing::LoadHfFixture(GetParam());
    ASSERT_THAT(fixture.status(), IsOk());
    CudaBackendOptions options;
    options.gpu_memory_fraction = 0.3;
    options.max_batch_tokens = 1024;
    options.max_batch_sequences = 32;
    options.kv_cache_tokens = 64 * 16;
    auto backend = CudaBackend::Create(fixture->model_dir, options);
    ASSERT_THAT(backend.status(), IsOk());
    backend_ = *std::move(backend);
    std::printf("%s\n", backend_->Describe().c_str());
    const model::ModelConfig& c = backend_->config();
    fake_ = std::make_unique<FakeRemoteAttention>(c.num_hidden_layers, c.num_attention_heads,
                                                  c.num_key_value_heads, c.head_dim);
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

  // max |a - b| over `a`'s range.
  static double Deviation(const std::vector<float>& a, const std::vector<float>& b) {
    const auto [lo, hi] = std::minmax_element(a.begin(), a.end());
    double worst = 0;
    for (size_t j = 0; j < a.size(); ++j) worst = std::max<double>(worst, std::abs(a[j] - b[j]));
    return worst / std::max(1e-6, static_cast<double>(*hi - *lo));
  }

  // Copies positions [0, n) of a sequence in `blocks` out of the device
  // cache into the fake (a migration to the service).
  void Migrate(absl::Span<const int32_t> blocks, int32_t n, uint64_t handle) {
    auto memory = backend_->kv_memory();
    ASSERT_THAT(memory.status(), IsOk());
    ASSERT_EQ(memory->spec.dtype, numeric::DType::kBF16);
    std::vector<char> pool(memory->bytes);
    ASSERT_EQ(cudaMemcpy(pool.data(), memory->base, memory->bytes, cudaMemcpyDeviceToHost),
              cudaSuccess);
    testing::MigrateToFake(pool.data(), memory->spec, blocks, n, handle, *fake_);
  }

  std::unique_ptr<CudaBackend> backend_;
  std::unique_ptr<FakeRemoteAttention> fake_;
};

const std::vector<int32_t> kPrompt = {5,  17, 99, 3,  250, 42, 7,  8,  9,
                                      10, 11, 12, 13, 14,  15, 16, 77, 78};

TEST_P(CudaRemoteAttentionTest, ARemoteSequenceDecodesAsAResidentOneDoes) {
  const int32_t n = static_cast<int32_t>(kPrompt.size());
  // Two copies of the same sequence: A stays resident (blocks 0-2), B is
  // prefilled into blocks 3-5 and then migrated to the service.
  const std::vector<int32_t> blocks_a = {0, 1, 2}, blocks_b = {3, 4, 5};
  auto prefill =
      Step({StepSequence{.tokens = kPrompt, .block_table = blocks_a, .want_logits = true},
            StepSequence{.tokens = kPrompt, .block_table = blocks_b, .want_logits = true}});
  ASSERT_EQ(prefill[0], prefill[1]);
  const uint64_t handle = fake_->Admit();
  Migrate(blocks_b, n, handle);
  int32_t token = Argmax(prefill[0]);
  int agree = 0;
  double worst = 0;
  for (int32_t step = 0; step < 20; ++step) {
    // Teacher-forced: both decode the resident copy's choice.
    std::vector<int32_t> tokens = {token};
    auto rows = Step({StepSequence{.tokens = tokens,
                                   .start_position = n + step,
                                   .block_table = blocks_a,
                                   .want_logits = true},
                      StepSequence{.tokens = tokens,
                                   .start_position = n + step,
                                   .want_logits = true,
                                   .remote = {fake_.get(), handle}}});
    worst = std::max(worst, Deviation(rows[0], rows[1]));
    agree += Argmax(rows[1]) == Argmax(rows[0]) ? 1 : 0;
    token = Argmax(rows[0]);
  }
  std::printf("%s: worst deviation %.2e of the logit range, greedy agreement %d/20\n",
              GetParam().c_str(), worst, agree);
  EXPECT_LE(worst, kTolerance);
  EXPECT_GE(agree, 19);
  EXPECT_EQ(fake_->requests(), 20 * backend_->config().num_hidden_layers);
}

TEST_P(CudaRemoteAttentionTest, APipelinedSubBatchDecodesAsTheWholeBatchDoes) {
  const int32_t n = static_cast<int32_t>(kPrompt.size());
  // Three copies: A resident, B and C at the service; C alone in the second
  // sub-batch, listed first so that its logits must be put back in place.
  const std::vector<int32_t> blocks_a = {0, 1, 2}, blocks_b = {3, 4, 5}, blocks_c = {6, 7, 8};
  auto prefill =
      Step({StepSequence{.tokens = kPrompt, .block_table = blocks_a, .want_logits = true},
            StepSequence{.tokens = kPrompt, .block_table = blocks_b},
            StepSequence{.tokens = kPrompt, .block_table = blocks_c}});
  const uint64_t hb = fake_->Admit(), hc = fake_->Admit();
  Migrate(blocks_b, n, hb);
  Migrate(blocks_c, n, hc);
  ASSERT_TRUE(backend_->supports_pipelining());
  const RemoteAttentionTiming before = backend_->remote_attention_timing();
  int32_t token = Argmax(prefill[0]);
  double worst = 0;
  for (int32_t step = 0; step < 10; ++step) {
    std::vector<int32_t> tokens = {token};
    auto rows = Step({StepSequence{.tokens = tokens,
                                   .start_position = n + step,
                                   .want_logits = true,
                                   .remote = {fake_.get(), hc},
                                   .sub_batch = 1},
                      StepSequence{.tokens = tokens,
                                   .start_position = n + step,
                                   .block_table = blocks_a,
                                   .want_logits = true},
                      StepSequence{.tokens = tokens,
                                   .start_position = n + step,
                                   .want_logits = true,
                                   .remote = {fake_.get(), hb}}});
    worst = std::max({worst, Deviation(rows[1], rows[0]), Deviation(rows[1], rows[2])});
    token = Argmax(rows[1]);
  }
  std::printf("%s pipelined: worst deviation %.2e of the logit range\n", GetParam().c_str(), worst);
  EXPECT_LE(worst, kTolerance);
  // Two requests per layer (one per sub-batch), each timed.
  const int32_t layers = backend_->config().num_hidden_layers;
  const RemoteAttentionTiming after = backend_->remote_attention_timing();
  EXPECT_EQ(fake_->requests(), 2 * 10 * layers);
  EXPECT_EQ(after.requests - before.requests, 2 * 10 * layers);
  EXPECT_GE(after.round_trip_seconds - before.round_trip_seconds,
            after.exposed_seconds - before.exposed_seconds);
}

TEST_P(CudaRemoteAttentionTest, BadSubBatchesAndADeadServiceFailCleanly) {
  const std::vector<int32_t> prompt = {1, 2, 3};
  const std::vector<int32_t> blocks = {0};
  std::vector<float> logits(2 * backend_->vocab_size());
  EXPECT_THAT(
      backend_->Forward(
          {StepSequence{
              .tokens = prompt, .block_table = blocks, .want_logits = true, .sub_batch = 1}},
          logits.data()),
      StatusIs(absl::StatusCode::kInvalidArgument));
  const std::vector<int32_t> two = {4, 5};
  EXPECT_THAT(backend_->Forward({StepSequence{.tokens = two,
                                              .start_position = 3,
                                              .want_logits = true,
                                              .remote = {fake_.get(), fake_->Admit()}}},
                                logits.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("one token")));
  Step({StepSequence{.tokens = prompt, .block_table = blocks, .want_logits = true}});
  const uint64_t handle = fake_->Admit();
  Migrate(blocks, 3, handle);
  fake_->Kill();
  const std::vector<int32_t> token = {4};
  absl::Status status = backend_->Forward(
      {StepSequence{
           .tokens = token, .start_position = 3, .block_table = blocks, .want_logits = true},
       StepSequence{.tokens = token,
                    .start_position = 3,
                    .want_logits = true,
                    .remote = {fake_.get(), handle}}},
      logits.data());
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(FailedRemoteAttention(status), fake_.get());
  // The backend still runs resident steps afterwards.
  Step({StepSequence{
      .tokens = token, .start_position = 3, .block_table = blocks, .want_logits = true}});
}

// Through the engine (device sampling): requests decode resident, move to
// the service, and come back by recompute when it dies; every request ends
// with its full length and every block comes back. Greedy tokens match the
// never-moved run's on nearly every position (bf16 rounding may flip a
// near-tie, after which a sequence continues differently).
TEST_P(CudaRemoteAttentionTest, TheEngineMovesSequencesOutAndBack) {
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
  int same = 0, total = 0;
  for (const auto& r : requests) {
    ASSERT_EQ(resident.tokens.at(r.id).size(), 24u);
    ASSERT_EQ(moved.tokens.at(r.id).size(), 24u);
    for (size_t i = 0; i < 24; ++i) {
      same += moved.tokens.at(r.id)[i] == resident.tokens.at(r.id)[i] ? 1 : 0;
    }
    total += 24;
  }
  std::printf("%s through the engine: %d/%d tokens as never moved\n", GetParam().c_str(), same,
              total);
  EXPECT_GE(same, total * 9 / 10);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaRemoteAttentionTest,
                         ::testing::Values("llama3-tiny", "qwen2-tiny", "mistral-tiny"),
                         [](const auto& info) { return testing::FixtureTestName(info.param); });

}  // namespace
}  // namespace trident::backend
