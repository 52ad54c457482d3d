// NEO-style offload across processes (CPU backend, fp32): a prefill worker,
// two decode workers (one offloading every sequence to a CPU attention
// service after its first decode step, one not) and the attention service,
// over UCX shared memory or tcp.
//
//  * Greedy tokens with offload equal those without, for every fixture model.
//  * The service's memory is all released at the end, after a cancel, and
//    after the decode worker is killed (its grace period).
//  * Killing the attention service mid-stream lets every request finish
//    with the same tokens (its sequences are recomputed on the worker).
//  * A colocated worker whose KV pool is too small for its requests moves
//    sequences out under pool pressure, copying their KV in the background
//    while it keeps decoding, with the same tokens.
//  * A decode worker places long prompts, and prompts its pool cannot hold,
//    on the service at reservation: the prefill worker writes their KV
//    there, and they decode there from their first step, with the same
//    tokens.

#include <signal.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/http/http_client.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/disaggregated_call.h"
#include "tests/testing/fixture_models.h"
#include "tests/testing/service_process.h"
#include "trident/v1/attention.grpc.pb.h"
#include "trident/v1/generation.grpc.pb.h"

namespace trident {
namespace {

using testing::DisaggregatedContexts;
using testing::DisaggregatedResult;
using testing::GenerateDisaggregated;
using testing::IsOk;
using testing::RunfilePath;
using testing::ServiceProcess;
using testing::TestTmpPath;
namespace v1 = ::trident::v1;

constexpr int32_t kMaxTokens = 24;
constexpr int kRequests = 4;
// Long enough that a request is still decoding when the test acts on it.
constexpr int32_t kLongTokens = 1500;

std::vector<int32_t> Prompt(int i) {
  std::vector<int32_t> prompt;
  for (int32_t t = 0; t < 20 + 9 * i; ++t) prompt.push_back(1 + (7 * i + 3 * t) % 200);
  return prompt;
}

struct Param {
  const char* model;
  const char* transport;
  // --offload_pipeline of the offloading worker.
  const char* pipeline;
};

class OffloadTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    model_dir_ = TestTmpPath(GetParam().model);
    ASSERT_THAT(testing::EnsureFixtureModel(GetParam().model, model_dir_), IsOk());
    ASSERT_THAT(StartAttention(), IsOk());
    auto prefill = StartWorker("prefill", "prefill-0", {});
    ASSERT_THAT(prefill.status(), IsOk());
    prefill_ = *std::move(prefill);
    auto resident = StartWorker("decode", "decode-resident", {});
    ASSERT_THAT(resident.status(), IsOk());
    resident_ = *std::move(resident);
    ASSERT_THAT(StartOffloadingWorker(), IsOk());
  }

  void TearDown() override {
    for (ServiceProcess* p : {&offloading_, &resident_, &prefill_, &attention_}) {
      testing::StopService(*p).IgnoreError();
    }
  }

  absl::Status StartAttention() {
    auto attention = testing::StartService(
        {RunfilePath("services/attention/attention"),
         absl::StrCat("--ucx_transports=", GetParam().transport), "--kv_budget_mb=16",
         "--reconnect_grace=1s", "--threads=1", "--spin_window=0s"},
        TestTmpPath(absl::StrCat("attention-", attention_starts_++, ".log")));
    if (!attention.ok()) return attention.status();
    attention_ = *std::move(attention);
    stub_ = v1::Attention::NewStub(attention_.channel);
    return absl::OkStatus();
  }

  absl::StatusOr<ServiceProcess> StartWorker(const std::string& role, const std::string& name,
                                             std::vector<std::string> extra) {
    std::vector<std::string> argv =
        testing::SmallCpuWorkerArgv(RunfilePath("services/worker/worker"), model_dir_, role, name);
    argv.push_back(absl::StrCat("--ucx_transports=", GetParam().transport));
    argv.insert(argv.end(), extra.begin(), extra.end());
    return testing::StartService(argv, TestTmpPath(absl::StrCat(name, ".log")));
  }

  absl::Status StartOffloadingWorker() {
    auto offloading = StartWorker("decode", "decode-offloading",
                                  {absl::StrCat("--attention_services=", attention_.address),
                                   "--offload_min_context_tokens=1", "--attention_timeout=3s",
                                   absl::StrCat("--offload_pipeline=", GetParam().pipeline)});
    if (!offloading.ok()) return offloading.status();
    offloading_ = *std::move(offloading);
    return absl::OkStatus();
  }

  v1::AttentionStats Stats() {
    v1::AttentionStats stats;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    stub_->GetStats(&context, v1::GetAttentionStatsRequest(), &stats);
    return stats;
  }

  // Polls the service (another process) until it holds nothing.
  v1::AttentionStats StatsOnceEmpty() {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    v1::AttentionStats stats = Stats();
    while ((stats.sequences() > 0 || stats.held_bytes() > 0) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
      stats = Stats();
    }
    return stats;
  }

  std::vector<std::vector<int32_t>> RunAll(const ServiceProcess& decode, const std::string& tag) {
    std::vector<std::vector<int32_t>> tokens(kRequests);
    std::vector<std::thread> threads;
    for (int i = 0; i < kRequests; ++i) {
      threads.emplace_back([&, i] {
        DisaggregatedContexts contexts;
        const DisaggregatedResult r = GenerateDisaggregated(
            prefill_, decode, absl::StrCat(tag, "-", i), Prompt(i), kMaxTokens, &contexts);
        EXPECT_TRUE(r.ok()) << tag << " " << i << ": " << r.reserve_status.error_message() << " / "
                            << r.prefill_status.error_message() << " / "
                            << r.decode_status.error_message();
        tokens[i] = r.tokens;
      });
    }
    for (std::thread& t : threads) t.join();
    return tokens;
  }

  // Greedy generation of `max_tokens` for Prompt(i) on a colocated worker.
  static std::vector<int32_t> GenerateColocated(const ServiceProcess& worker, int i,
                                                int32_t max_tokens) {
    v1::GenerateRequest request;
    request.set_request_id(absl::StrCat("colocated-", i));
    for (int32_t t : Prompt(i)) request.mutable_token_ids()->add_ids(t);
    request.mutable_sampling()->set_temperature(0);
    request.mutable_sampling()->set_max_tokens(max_tokens);
    request.mutable_stop()->set_ignore_eos(true);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
    auto reader = v1::Generation::NewStub(worker.channel)->Generate(&context, request);
    std::vector<int32_t> tokens;
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      if (!response.has_chunk()) continue;
      tokens.insert(tokens.end(), response.chunk().token_ids().begin(),
                    response.chunk().token_ids().end());
    }
    const grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << "request " << i << ": " << status.error_message();
    return tokens;
  }

  static std::vector<std::vector<int32_t>> GenerateAllColocated(const ServiceProcess& worker,
                                                                int32_t max_tokens) {
    std::vector<std::vector<int32_t>> tokens(kRequests);
    std::vector<std::thread> threads;
    for (int i = 0; i < kRequests; ++i) {
      threads.emplace_back([&, i] { tokens[i] = GenerateColocated(worker, i, max_tokens); });
    }
    for (std::thread& t : threads) t.join();
    return tokens;
  }

  std::string model_dir_;
  int attention_starts_ = 0;
  ServiceProcess attention_, prefill_, resident_, offloading_;
  std::unique_ptr<v1::Attention::Stub> stub_;
};

TEST_P(OffloadTest, OffloadedRequestsMatchResidentOnesAndFreeTheirMemory) {
  const auto resident = RunAll(resident_, "resident");
  const auto offloaded = RunAll(offloading_, "offloaded");
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(resident[i].size(), kMaxTokens) << i;
    EXPECT_EQ(offloaded[i], resident[i]) << "request " << i;
  }
  const v1::AttentionStats stats = StatsOnceEmpty();
  EXPECT_GT(stats.attention_requests_total(), 0) << "nothing was offloaded";
  EXPECT_EQ(stats.sequences(), 0);
  EXPECT_EQ(stats.held_bytes(), 0);
  // The worker counts its moves.
  absl::StatusOr<http::HttpResponse> metrics = http::Get(
      absl::StrCat("http://127.0.0.1:", offloading_.metrics_port, "/metrics"), absl::Seconds(5));
  ASSERT_THAT(metrics.status(), IsOk());
  EXPECT_THAT(metrics->body,
              ::testing::ContainsRegex(absl::StrCat(
                  "trident_worker_offload_decisions_total\\{decision=\"moved\"\\} ", kRequests)));
  EXPECT_THAT(metrics->body, ::testing::HasSubstr("trident_worker_cpu_attention_sequences 0"));
  // Pipelined steps (two sub-batches) exactly where asked for; either way
  // the tokens above are the resident worker's.
  const std::string pipelined = "trident_worker_pipelined_steps_total ";
  if (std::string(GetParam().pipeline) == "always") {
    EXPECT_THAT(metrics->body, ::testing::ContainsRegex(pipelined + "[1-9]"));
  } else if (std::string(GetParam().pipeline) == "never") {
    EXPECT_THAT(metrics->body, ::testing::HasSubstr(pipelined + "0\n"));
  }
  EXPECT_THAT(metrics->body, ::testing::ContainsRegex(
                                 "trident_worker_cpu_attention_seconds_total [0-9.e-]*[1-9]"));
  std::printf("%s over %s: %lld attention requests served\n", GetParam().model,
              GetParam().transport, static_cast<long long>(stats.attention_requests_total()));
}

TEST_P(OffloadTest, ACancelledRequestReleasesItsCopy) {
  DisaggregatedContexts contexts;
  absl::Notification first;
  bool moved = false;
  std::thread canceller([&] {
    first.WaitForNotification();
    // Wait for the sequence to have moved, then cancel.
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!(moved = Stats().sequences() > 0) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    contexts.Cancel();
  });
  const DisaggregatedResult r = GenerateDisaggregated(prefill_, offloading_, "cancelled", Prompt(3),
                                                      kLongTokens, &contexts, &first);
  if (!first.HasBeenNotified()) first.Notify();
  canceller.join();
  EXPECT_TRUE(moved) << "the request never moved: " << r.decode_status.error_message();
  EXPECT_EQ(r.decode_status.error_code(), grpc::StatusCode::CANCELLED);
  const v1::AttentionStats stats = StatsOnceEmpty();
  EXPECT_EQ(stats.sequences(), 0);
  EXPECT_EQ(stats.held_bytes(), 0);
}

TEST_P(OffloadTest, AKilledDecodeWorkersSequencesAreFreedAfterTheGrace) {
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      DisaggregatedContexts contexts;
      GenerateDisaggregated(prefill_, offloading_, absl::StrCat("doomed-", i), Prompt(i),
                            kLongTokens, &contexts);
    });
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (Stats().sequences() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(Stats().sequences(), 2);
  kill(offloading_.pid, SIGKILL);
  for (std::thread& t : threads) t.join();
  offloading_.pid = -1;
  const v1::AttentionStats stats = StatsOnceEmpty();
  EXPECT_EQ(stats.sequences(), 0);
  EXPECT_EQ(stats.held_bytes(), 0);
  EXPECT_EQ(stats.sessions(), 0);
}

TEST_P(OffloadTest, KillingTheAttentionServiceCostsNoRequest) {
  const auto resident = RunAll(resident_, "resident");
  std::vector<std::vector<int32_t>> offloaded(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      DisaggregatedContexts contexts;
      const DisaggregatedResult r = GenerateDisaggregated(
          prefill_, offloading_, absl::StrCat("survivor-", i), Prompt(i), kMaxTokens, &contexts);
      EXPECT_TRUE(r.ok()) << i << ": " << r.decode_status.error_message();
      offloaded[i] = r.tokens;
    });
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (Stats().sequences() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  kill(attention_.pid, SIGKILL);
  attention_.pid = -1;
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) EXPECT_EQ(offloaded[i], resident[i]) << "request " << i;
}

TEST_P(OffloadTest, PoolPressureMovesCopyInTheBackgroundAndKeepTheTokens) {
  if (std::string(GetParam().model) != "llama3-tiny") {
    GTEST_SKIP() << "one model per transport is enough here";
  }
  // llama3-tiny's KV is 2 KiB a token (f32): a 1 MiB pool holds 512 tokens,
  // less than the requests' ~1000 at their end.
  constexpr int32_t kTokens = 200;
  auto resident = StartWorker("both", "both-resident", {});
  ASSERT_THAT(resident.status(), IsOk());
  auto offloading =
      StartWorker("both", "both-offloading",
                  {"--kv_cache_mb=1", absl::StrCat("--attention_services=", attention_.address),
                   "--offload_min_context_tokens=0", "--offload_low_watermark=0.3",
                   "--offload_background_moves=true", "--attention_timeout=3s",
                   absl::StrCat("--offload_pipeline=", GetParam().pipeline)});
  ASSERT_THAT(offloading.status(), IsOk());
  const auto expected = GenerateAllColocated(*resident, kTokens);
  const auto got = GenerateAllColocated(*offloading, kTokens);
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(expected[i].size(), kTokens) << i;
    EXPECT_EQ(got[i], expected[i]) << "request " << i;
  }
  EXPECT_TRUE(testing::AllKvBlocksFree(*offloading));
  const v1::AttentionStats stats = StatsOnceEmpty();
  EXPECT_EQ(stats.sequences(), 0);
  EXPECT_EQ(stats.held_bytes(), 0);
  absl::StatusOr<http::HttpResponse> metrics = http::Get(
      absl::StrCat("http://127.0.0.1:", offloading->metrics_port, "/metrics"), absl::Seconds(5));
  ASSERT_THAT(metrics.status(), IsOk());
  EXPECT_THAT(metrics->body,
              ::testing::ContainsRegex(
                  "trident_worker_offload_decisions_total\\{decision=\"moved\"\\} [1-9]"));
  std::printf("%s over %s: %lld attention requests served under pool pressure\n", GetParam().model,
              GetParam().transport, static_cast<long long>(stats.attention_requests_total()));
  for (ServiceProcess* p : {&*offloading, &*resident}) testing::StopService(*p).IgnoreError();
}

TEST_P(OffloadTest, PromptsPlacedOnTheServiceAreWrittenThereByThePrefillWorker) {
  if (std::string(GetParam().model) != "llama3-tiny") {
    GTEST_SKIP() << "one model per transport is enough here";
  }
  // A 1 MiB pool holds 512 tokens of this model (2 KiB each); prompts whose
  // sequences may reach 1000 tokens go to the CPU at reservation. Its blocks
  // (and its prefill worker's) are 8 tokens, the service's 16: the prompt is
  // written in rows whatever either side's blocks.
  auto prefill8 = StartWorker("prefill", "prefill-8", {"--kv_block_size=8"});
  ASSERT_THAT(prefill8.status(), IsOk());
  ServiceProcess prefill_worker = *std::move(prefill8);
  auto placing = StartWorker("decode", "decode-placing",
                             {"--kv_cache_mb=1", "--kv_block_size=8",
                              absl::StrCat("--attention_services=", attention_.address),
                              "--offload_min_context_tokens=1000", "--attention_timeout=3s",
                              absl::StrCat("--offload_pipeline=", GetParam().pipeline)});
  ASSERT_THAT(placing.status(), IsOk());
  ServiceProcess placing_worker = *std::move(placing);
  auto long_prompt = [](int32_t n) {
    std::vector<int32_t> prompt;
    for (int32_t t = 0; t < n; ++t) prompt.push_back(1 + (11 * t) % 200);
    return prompt;
  };
  // Short: in the pool. Beyond the pool (below the threshold): placed
  // because the blocks are short. Past the threshold: placed as long.
  const std::vector<std::vector<int32_t>> prompts = {Prompt(0), long_prompt(700),
                                                     long_prompt(1100)};
  const std::vector<bool> on_cpu = {false, true, true};
  std::vector<std::vector<int32_t>> references;
  for (size_t i = 0; i < prompts.size(); ++i) {
    DisaggregatedContexts reference_contexts;
    const DisaggregatedResult reference =
        GenerateDisaggregated(prefill_, resident_, absl::StrCat("reference-", i), prompts[i],
                              kMaxTokens, &reference_contexts);
    ASSERT_TRUE(reference.ok()) << i;
    references.push_back(reference.tokens);
    DisaggregatedContexts contexts;
    contexts.allow_cpu_attention = true;
    const DisaggregatedResult r =
        GenerateDisaggregated(prefill_worker, placing_worker, absl::StrCat("placed-", i),
                              prompts[i], kMaxTokens, &contexts);
    ASSERT_TRUE(r.ok()) << i << ": " << r.reserve_status.error_message() << " / "
                        << r.prefill_status.error_message() << " / "
                        << r.decode_status.error_message();
    EXPECT_EQ(r.tokens, reference.tokens) << "prompt " << i;
    EXPECT_EQ(r.tokens.size(), kMaxTokens) << i;
    EXPECT_EQ(r.placed_on_cpu, on_cpu[i]) << i;
    EXPECT_EQ(!r.attention_service_id.empty(), on_cpu[i]) << i;
    EXPECT_EQ(r.lane == "attention", on_cpu[i]) << i << ": KV went over " << r.lane;
  }
  const v1::AttentionStats stats = StatsOnceEmpty();
  EXPECT_EQ(stats.sequences(), 0);
  EXPECT_EQ(stats.held_bytes(), 0);
  absl::StatusOr<http::HttpResponse> metrics = http::Get(
      absl::StrCat("http://127.0.0.1:", placing_worker.metrics_port, "/metrics"), absl::Seconds(5));
  ASSERT_THAT(metrics.status(), IsOk());
  EXPECT_THAT(metrics->body, ::testing::HasSubstr(
                                 "trident_worker_offload_decisions_total{decision=\"placed\"} 2"));
  EXPECT_THAT(metrics->body,
              ::testing::HasSubstr("trident_worker_offload_decisions_total{decision=\"moved\"} 0"));
  testing::StopService(placing_worker).IgnoreError();
  // With a step-time target no placement can meet (--offload_max_step_time;
  // the planner has costs only with --offload_pipeline=auto), the long
  // prompt stays in a worker's blocks, with the same tokens.
  if (std::string(GetParam().pipeline) == "auto") {
    auto guarded =
        StartWorker("decode", "decode-guarded",
                    {"--kv_block_size=8", absl::StrCat("--attention_services=", attention_.address),
                     "--offload_min_context_tokens=1000", "--offload_max_step_time=1us",
                     "--attention_timeout=3s", "--offload_pipeline=auto"});
    ASSERT_THAT(guarded.status(), IsOk());
    ServiceProcess guarded_worker = *std::move(guarded);
    DisaggregatedContexts contexts;
    contexts.allow_cpu_attention = true;
    const DisaggregatedResult r = GenerateDisaggregated(prefill_worker, guarded_worker, "guarded",
                                                        prompts[2], kMaxTokens, &contexts);
    ASSERT_TRUE(r.ok()) << r.reserve_status.error_message() << " / "
                        << r.prefill_status.error_message() << " / "
                        << r.decode_status.error_message();
    EXPECT_FALSE(r.placed_on_cpu);
    EXPECT_EQ(r.tokens, references[2]);
    testing::StopService(guarded_worker).IgnoreError();
  }
  testing::StopService(prefill_worker).IgnoreError();
}

INSTANTIATE_TEST_SUITE_P(ModelsAndTransports, OffloadTest,
                         ::testing::Values(Param{"llama3-tiny", "posix", "auto"},
                                           Param{"qwen2-tiny", "posix", "always"},
                                           Param{"mistral-tiny", "posix", "never"},
                                           Param{"llama3-tiny", "tcp", "always"}),
                         [](const auto& info) {
                           std::string name =
                               absl::StrCat(info.param.model, "_", info.param.transport, "_",
                                            info.param.pipeline);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace trident
