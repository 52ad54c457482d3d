// The load generator against a real worker process (role `both`, CPU
// backend, the generated llama3-tiny model): every request completes with
// exactly its requested output length, the report is complete and
// consistent, the in-flight cap drops instead of delaying, and the binary
// writes the same JSON report.

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/runner.h"
#include "bench/loadgen/workload.h"
#include "common/model/generate/model_gen.h"
#include "common/process/subprocess.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace trident::loadgen {
namespace {

using ::testing::Le;
using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::TestTmpPath;

constexpr uint64_t kSeed = 20261121;

class LoadgenWorkerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::printf("seed=%llu\n", static_cast<unsigned long long>(kSeed));
    const std::string model_dir = TestTmpPath("llama3-tiny");
    absl::StatusOr<model::generate::ModelSpec> spec = model::generate::PresetSpec("llama3-tiny");
    ASSERT_THAT(spec.status(), IsOk());
    ASSERT_THAT(model::generate::WriteModel(*spec, model_dir), IsOk());
    log_ = new std::string(TestTmpPath("worker.log"));
    absl::StatusOr<SpawnedProcess> spawned =
        Spawn({.argv = {RunfilePath("services/worker/worker"), "--host=127.0.0.1", "--port=0",
                        "--metrics_port=0", "--role=both", "--pin_threads=false", "--cpu_threads=2",
                        "--kv_cache_mb=16", absl::StrCat("--model=", model_dir)},
               .log_path = *log_,
               .wait_for_ready_line = true});
    ASSERT_THAT(spawned, IsOk());
    pid_ = spawned->pid;
    const nlohmann::json ready = nlohmann::json::parse(spawned->ready_line);
    target_ = new std::string(absl::StrCat("127.0.0.1:", ready["grpc_port"].get<int>()));
  }

  static void TearDownTestSuite() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    absl::StatusOr<ExitInfo> exit = WaitForExit(pid_, absl::Seconds(10));
    EXPECT_THAT(exit, IsOk());
    if (exit.ok()) {
      EXPECT_EQ(exit->exit_code, 0) << TailOfFile(*log_);
    }
  }

  static RunOptions Options(int64_t num_requests, double rate) {
    RunOptions options;
    options.target = *target_;
    options.request_timeout = absl::Seconds(120);
    options.print_progress = false;
    WorkloadSpec& w = options.workload;
    w.seed = kSeed;
    w.arrival = {.kind = ArrivalKind::kPoisson, .rate_per_s = rate};
    w.num_requests = num_requests;
    w.qos = {QosClassSpec{}};
    return options;
  }

  static std::string* log_;
  static std::string* target_;
  static pid_t pid_;
};

std::string* LoadgenWorkerTest::log_ = nullptr;
std::string* LoadgenWorkerTest::target_ = nullptr;
pid_t LoadgenWorkerTest::pid_ = -1;

void ExpectOrdered(const nlohmann::json& stats, const std::string& name) {
  SCOPED_TRACE(name);
  EXPECT_GT(stats["count"].get<int64_t>(), 0);
  EXPECT_LE(stats["p50"].get<double>(), stats["p90"].get<double>());
  EXPECT_LE(stats["p90"].get<double>(), stats["p99"].get<double>());
  EXPECT_LE(stats["p99"].get<double>(), stats["max"].get<double>());
  EXPECT_GE(stats["p50"].get<double>(), 0);
}

TEST_F(LoadgenWorkerTest, EveryRequestCompletesWithItsExactOutputLength) {
  RunOptions options = Options(/*num_requests=*/60, /*rate=*/6);
  WorkloadSpec& w = options.workload;
  absl::StatusOr<LengthDistribution> prompt =
      ParseLengthDistribution("uniform:4:48", LengthColumn::kPrompt, "--prompt_tokens");
  absl::StatusOr<LengthDistribution> output =
      ParseLengthDistribution("uniform:2:24", LengthColumn::kOutput, "--output_tokens");
  ASSERT_THAT(prompt, IsOk());
  ASSERT_THAT(output, IsOk());
  w.prompt_tokens = *prompt;
  w.output_tokens = *output;
  absl::StatusOr<std::vector<QosClassSpec>> qos =
      ParseQosMix("interactive:0.5:ttft=2000:tpot=500,batch:0.5",
                  SloTargets{.ttft = absl::Seconds(20), .tpot = std::nullopt});
  ASSERT_THAT(qos, IsOk());
  w.qos = *qos;

  absl::StatusOr<RunResult> result = RunLoad(options);
  ASSERT_THAT(result, IsOk());

  ASSERT_EQ(result->records.size(), 60u);
  for (const RequestRecord& r : result->records) {
    SCOPED_TRACE(absl::StrCat("request ", r.planned.index));
    EXPECT_THAT(r.status, IsOk());
    EXPECT_EQ(OutcomeOf(r), Outcome::kCompleted);
    EXPECT_EQ(r.finish_reason, FinishReason::kLength);
    EXPECT_EQ(r.tokens_received(), r.planned.output_tokens);
    EXPECT_EQ(r.completion_tokens, r.planned.output_tokens);
    EXPECT_GE(r.sent, r.scheduled);
    EXPECT_GE(r.chunks.front().time, r.sent);
    EXPECT_GE(r.end, r.chunks.back().time);
  }
  const Report& report = result->report;
  EXPECT_EQ(report.num_completed, 60);
  EXPECT_EQ(report.num_wrong_length, 0);
  EXPECT_EQ(report.num_rejected + report.num_failed + report.num_dropped, 0);

  const nlohmann::json& json = result->json;
  std::printf("%s\n", json.dump(2).c_str());
  EXPECT_EQ(json["config"]["seed"].get<uint64_t>(), kSeed);
  EXPECT_EQ(json["config"]["arrival"]["kind"], "poisson");
  EXPECT_EQ(json["config"]["arrival"]["rate_per_s"].get<double>(), 6.0);
  EXPECT_EQ(json["config"]["prompt_tokens"]["spec"], "uniform:4:48");
  EXPECT_EQ(json["config"]["output_tokens"]["spec"], "uniform:2:24");
  EXPECT_EQ(json["config"]["num_requests"], 60);
  EXPECT_EQ(json["config"]["qos"].size(), 2u);
  EXPECT_EQ(json["config"]["model"]["vocab_size"], 512);
  EXPECT_EQ(json["requests"]["completed"], 60);
  EXPECT_EQ(json["requests"]["measured"], 60);
  EXPECT_TRUE(json["rejections"]["by_code"].empty());
  EXPECT_TRUE(json["rejections"]["groups"].empty());
  EXPECT_EQ(json["per_class"]["interactive"]["measured"].get<int64_t>() +
                json["per_class"]["batch"]["measured"].get<int64_t>(),
            60);
  for (const char* metric : {"ttft", "tpot", "itl", "e2e", "send_lag"}) {
    ExpectOrdered(json["latency_ms"][metric], metric);
  }
  int64_t total_output = 0;
  int64_t total_gaps = 0;
  for (const RequestRecord& r : result->records) {
    total_output += r.planned.output_tokens;
    total_gaps += r.planned.output_tokens - r.chunks.front().num_tokens;
  }
  EXPECT_EQ(json["latency_ms"]["itl"]["count"].get<int64_t>(), total_gaps);

  const double window = json["measured_window_s"].get<double>();
  const double goodput = json["throughput"]["goodput_rps"].get<double>();
  const int64_t completed = json["requests"]["completed"].get<int64_t>();
  const int64_t met = json["slo"]["met"].get<int64_t>();
  ASSERT_GT(window, 0);
  // The window covers at least the arrivals of the schedule.
  EXPECT_GE(window, absl::ToDoubleSeconds(result->records.back().planned.send_offset));
  EXPECT_THAT(goodput, Le(completed / window + 1e-9));
  EXPECT_NEAR(goodput * window, static_cast<double>(met), 1e-6);
  EXPECT_LE(met, completed);
  EXPECT_NEAR(json["throughput"]["output_tokens_per_s"].get<double>() * window,
              static_cast<double>(total_output), 1e-6);
  EXPECT_NEAR(json["slo"]["attainment"].get<double>(), static_cast<double>(met) / completed, 1e-12);
}

TEST_F(LoadgenWorkerTest, RequestsOverTheInFlightCapAreDroppedNotDelayed) {
  // Ten arrivals within a few milliseconds; the first takes at least 200
  // decode steps, so the cap of one is reached for the rest.
  RunOptions options = Options(/*num_requests=*/10, /*rate=*/2000);
  options.max_in_flight = 1;
  options.workload.prompt_tokens = LengthDistribution{.min_tokens = 4, .max_tokens = 4};
  options.workload.output_tokens = LengthDistribution{.min_tokens = 200, .max_tokens = 200};
  absl::StatusOr<RunResult> result = RunLoad(options);
  ASSERT_THAT(result, IsOk());
  ASSERT_LT(result->records.back().planned.send_offset, absl::Milliseconds(50));
  EXPECT_GE(result->report.num_dropped, 1);
  EXPECT_EQ(result->report.num_completed + result->report.num_dropped, 10);
  for (const RequestRecord& r : result->records) {
    if (r.dropped) {
      EXPECT_TRUE(r.chunks.empty());
    } else {
      EXPECT_EQ(r.tokens_received(), 200);
    }
  }
  EXPECT_EQ(result->json["requests"]["dropped"].get<int64_t>(), result->report.num_dropped);
}

TEST_F(LoadgenWorkerTest, BinaryWritesTheJsonReport) {
  const std::string csv = TestTmpPath("lengths.csv");
  std::ofstream(csv) << "prompt_tokens,output_tokens\n5,3\n9,7\n";
  const std::string json_path = TestTmpPath("report.json");
  const std::string log = TestTmpPath("loadgen.log");
  absl::StatusOr<SpawnedProcess> loadgen =
      Spawn({.argv = {RunfilePath("bench/loadgen/loadgen"), absl::StrCat("--target=", *target_),
                      "--rate=20", "--arrival=gamma", "--gamma_shape=0.5", "--num_requests=12",
                      absl::StrCat("--prompt_tokens=csv:", csv),
                      absl::StrCat("--output_tokens=csv:", csv), "--qos=", "--ttft_slo_ms=30000",
                      absl::StrCat("--seed=", kSeed), absl::StrCat("--json_out=", json_path),
                      "--max_inflight=64"},
             .log_path = log});
  ASSERT_THAT(loadgen, IsOk());
  absl::StatusOr<ExitInfo> exit = WaitForExit(loadgen->pid, absl::Seconds(120));
  ASSERT_THAT(exit, IsOk());
  ASSERT_EQ(exit->exit_code, 0) << TailOfFile(log);
  const std::string output = TailOfFile(log, 100000);
  EXPECT_THAT(output, ::testing::HasSubstr("requests: 12 measured"));
  EXPECT_THAT(output, ::testing::HasSubstr("sent=12"));  // The final progress line.

  std::ifstream in(json_path);
  const nlohmann::json json = nlohmann::json::parse(
      std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()), nullptr,
      /*allow_exceptions=*/false);
  ASSERT_FALSE(json.is_discarded()) << "not JSON: " << json_path;
  EXPECT_EQ(json["config"]["seed"].get<uint64_t>(), kSeed);
  EXPECT_EQ(json["config"]["arrival"]["kind"], "gamma");
  EXPECT_EQ(json["config"]["arrival"]["gamma_shape"].get<double>(), 0.5);
  EXPECT_EQ(json["config"]["prompt_tokens"]["kind"], "csv");
  EXPECT_EQ(json["config"]["qos"][0]["ttft_slo_ms"].get<double>(), 30000);
  EXPECT_EQ(json["requests"]["completed"], 12);
  EXPECT_EQ(json["requests"]["wrong_length"], 0);
  for (const char* metric : {"ttft", "tpot", "itl", "e2e"}) {
    ExpectOrdered(json["latency_ms"][metric], metric);
  }
  const double window = json["measured_window_s"].get<double>();
  ASSERT_GT(window, 0);
  EXPECT_LE(json["throughput"]["goodput_rps"].get<double>(), 12 / window + 1e-9);
}

}  // namespace
}  // namespace trident::loadgen
