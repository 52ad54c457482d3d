// KV-aware routing through real processes on loopback: a router in front of
// two prefill workers and one decode worker (CPU backend, llama3-tiny, KV
// over UCX tcp). The workers publish their prefix caches' keys on their load
// streams; the router sends a repeated prefix to a prefill worker holding it
// (usage.cached_tokens shows the reuse, and what admission predicted equals
// what the workers delivered), and a restarted router, which rebuilds its
// index from the workers' snapshots, does the same. (How a hot
// prefix spreads once its holder's queue outweighs the saving is
// admission_controller_test's AHotPrefixSpreads...; a restarted worker's
// index is kv_index_test's.)

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/http/http_client.h"
#include "common/process/subprocess.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/fixture_models.h"
#include "tests/testing/metrics_scrape.h"
#include "tests/testing/service_process.h"
#include "trident/v1/generation.grpc.pb.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::ServiceProcess;
using ::trident::testing::TestTmpPath;

class KvRoutingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = TestTmpPath("llama3-tiny");
    ASSERT_THAT(testing::EnsureFixtureModel("llama3-tiny", model_dir_), IsOk());
    for (auto [name, role, process] :
         {std::tuple{"p0", "prefill", &p0_}, std::tuple{"p1", "prefill", &p1_},
          std::tuple{"d", "decode", &decode_}}) {
      std::vector<std::string> argv = testing::SmallCpuWorkerArgv(
          RunfilePath("services/worker/worker"), model_dir_, role, name);
      argv.push_back("--ucx_transports=tcp");
      auto started = testing::StartService(argv, TestTmpPath(absl::StrCat(name, ".log")));
      ASSERT_THAT(started, IsOk());
      *process = *started;
    }
    StartRouter("router-1");
  }

  void TearDown() override {
    for (ServiceProcess* p : {&router_, &p0_, &p1_, &decode_}) {
      EXPECT_THAT(testing::StopService(*p), IsOk());
    }
  }

  void StartRouter(const std::string& log) {
    auto router = testing::StartService(
        {RunfilePath("services/router/router"), absl::StrCat("--model=", model_dir_),
         absl::StrCat("--prefill_workers=", p0_.address, ",", p1_.address),
         absl::StrCat("--decode_workers=", decode_.address), "--load_interval_ms=20"},
        TestTmpPath(absl::StrCat(log, ".log")));
    ASSERT_THAT(router, IsOk());
    router_ = *router;
    // Requests sent before the first load reports are refused at once.
    ASSERT_TRUE(testing::RouterKnowsWorkers(router_, {"p0", "p1", "d"}));
  }

  struct Result {
    grpc::Status status;
    v1::GenerateComplete complete;
  };
  // One greedy generation, retried while the router has no load reports yet
  // (RESOURCE_EXHAUSTED at once).
  Result Generate(const std::vector<int32_t>& prompt) {
    auto stub = v1::Generation::NewStub(router_.channel);
    v1::GenerateRequest request;
    for (int32_t t : prompt) request.mutable_token_ids()->add_ids(t);
    request.mutable_sampling()->set_temperature(0);
    request.mutable_sampling()->set_max_tokens(2);
    request.mutable_stop()->set_ignore_eos(true);
    Result r;
    for (int attempt = 0; attempt < 200; ++attempt) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      auto reader = stub->Generate(&context, request);
      v1::GenerateResponse response;
      while (reader->Read(&response)) {
        if (response.has_complete()) r.complete = response.complete();
      }
      r.status = reader->Finish();
      if (r.status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
    }
    return r;
  }

  // Reads `worker`'s load stream until a sample's KV events show a stored
  // key: the worker has published its cache.
  static bool AwaitPublishedKeys(const ServiceProcess& worker) {
    auto stub = v1::WorkerControl::NewStub(worker.channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::GetLoadRequest request;
    request.mutable_interval()->set_nanos(10'000'000);
    auto reader = stub->GetLoad(&context, request);
    v1::WorkerLoad load;
    while (reader->Read(&load)) {
      for (bool stored : load.kv_events().stored()) {
        if (stored) {
          context.TryCancel();
          return true;
        }
      }
    }
    return false;
  }

  const ServiceProcess& Worker(const std::string& id) const { return id == "p0" ? p0_ : p1_; }

  // A counter of the router's /metrics (-1 when absent).
  double RouterCounter(absl::string_view name) const {
    absl::StatusOr<http::HttpResponse> metrics = http::Get(
        absl::StrCat("http://127.0.0.1:", router_.metrics_port, "/metrics"), absl::Seconds(5));
    if (!metrics.ok()) return -1;
    for (absl::string_view line : absl::StrSplit(metrics->body, '\n')) {
      if (absl::ConsumePrefix(&line, name) && absl::ConsumePrefix(&line, " ")) {
        double v = 0;
        if (absl::SimpleAtod(line, &v)) return v;
      }
    }
    return -1;
  }

  std::string model_dir_;
  ServiceProcess p0_, p1_, decode_, router_;
};

// A long shared prefix (1200 tokens): its prefill outweighs what admission's
// calibration may add to the holder's forecast (a worker that has served is
// judged on its measured slowdown, up to 4x its model, an idle one on its
// model alone), so the prefix decides.
constexpr int32_t kPrefix = 1200;

std::vector<int32_t> Prompt(int32_t salt) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < kPrefix; ++i) p.push_back((i * 37 + 11) % 400 + 1);
  for (int32_t i = 0; i < 5; ++i) p.push_back((salt * 13 + i) % 400 + 1);
  return p;
}

TEST_F(KvRoutingTest, ARepeatedPrefixGoesToItsHolderAlsoAfterARouterRestart) {
  const Result first = Generate(Prompt(0));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  const std::string holder = first.complete.placement().prefill_worker_id();
  ASSERT_TRUE(holder == "p0" || holder == "p1") << holder;
  EXPECT_EQ(first.complete.usage().cached_tokens(), 0);
  ASSERT_TRUE(AwaitPublishedKeys(Worker(holder)));

  // The router learns of the keys on its own stream within a sample or two
  // (20 ms): the first request may still be priced without them, every
  // later one goes to the holder and reuses the prefix (75 whole blocks).
  auto route = [&](int from, int n, const std::string& label) {
    int hits = 0;
    const auto counters = [&] {
      // Absent (-1) before the first increment.
      return std::pair{
          std::max(0.0, RouterCounter("trident_router_prefix_cache_predicted_tokens_total")),
          std::max(0.0, RouterCounter("trident_router_prefix_cache_delivered_tokens_total"))};
    };
    const auto at_start = counters();
    std::pair<double, double> after_first;
    for (int i = from; i < from + n; ++i) {
      const Result r = Generate(Prompt(i));
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();
      if (i == from) after_first = counters();
      // A worker that computed the prefix once holds it too: either may
      // serve it then (ties go by load), but never one without it.
      const bool hit = r.complete.usage().cached_tokens() == kPrefix;
      hits += hit ? 1 : 0;
      if (i > from) {
        EXPECT_TRUE(hit) << label << " request " << i << " on "
                         << r.complete.placement().prefill_worker_id() << " reused "
                         << r.complete.usage().cached_tokens() << " tokens";
      }
    }
    // The index is exact once the keys have arrived: admission predicted
    // what the workers delivered for every request after the first. The
    // first may be priced while the keys are still arriving (a part of
    // them): never above what was delivered.
    const auto [predicted, delivered] = counters();
    std::printf(
        "%s: %d of %d requests reused the %d-token prefix; predicted %.0f, delivered %.0f "
        "cached tokens (the first request: %.0f, %.0f)\n",
        label.c_str(), hits, n, kPrefix, predicted - at_start.first, delivered - at_start.second,
        after_first.first - at_start.first, after_first.second - at_start.second);
    EXPECT_EQ(predicted - after_first.first, delivered - after_first.second) << label;
    EXPECT_LE(after_first.first - at_start.first, after_first.second - at_start.second) << label;
    EXPECT_GE(delivered - at_start.second, (n - 1) * kPrefix) << label;
  };
  route(1, 5, "first router");

  // A new router process knows nothing until the workers' snapshots arrive
  // on its streams; then it routes the same way.
  ASSERT_THAT(testing::StopService(router_), IsOk());
  StartRouter("router-2");
  route(10, 5, "restarted router");
}

}  // namespace
}  // namespace trident
