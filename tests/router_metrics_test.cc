// Metrics of disaggregated serving through real processes on loopback
// (router -> prefill worker -> KV over UCX -> decode worker): after one
// generation the router's /metrics counts it (outcome, TTFT, TPOT, E2E,
// in-flight stages, rejections while no load had arrived, worker gauges),
// the prefill worker's counts one KV transfer over the lane it logs, and the
// decode worker's reservation gauge returns to 0; a cancelled generation
// counts as cancelled.

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/types/optional.h"
#include "common/http/http_client.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/fixture_models.h"
#include "tests/testing/metrics_scrape.h"
#include "tests/testing/service_process.h"
#include "trident/v1/generation.grpc.pb.h"

namespace trident {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::TestTmpPath;

using ::trident::testing::Scrape;
using ::trident::testing::ScrapeUntil;
using ::trident::testing::ServiceProcess;
using ::trident::testing::ValueOf;

bool Is(const std::string& body, const std::string& series, double want) {
  const absl::optional<double> v = ValueOf(body, series);
  return v.has_value() && *v == want;
}

class RouterMetricsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ = new std::string(TestTmpPath("llama3-tiny"));
    ASSERT_THAT(testing::EnsureFixtureModel("llama3-tiny", *model_dir_), IsOk());
    auto worker = [](const std::string& role) {
      return testing::StartService(
          {RunfilePath("services/worker/worker"), absl::StrCat("--role=", role),
           absl::StrCat("--worker_id=", role), "--pin_threads=false", "--cpu_threads=1",
           "--kv_cache_mb=16", "--ucx_transports=tcp", absl::StrCat("--model=", *model_dir_)},
          TestTmpPath(absl::StrCat(role, ".log")));
    };
    auto prefill = worker("prefill");
    ASSERT_THAT(prefill, IsOk());
    prefill_ = new ServiceProcess(*prefill);
    auto decode = worker("decode");
    ASSERT_THAT(decode, IsOk());
    decode_ = new ServiceProcess(*decode);
    auto router = testing::StartService(
        {RunfilePath("services/router/router"), absl::StrCat("--model=", *model_dir_),
         absl::StrCat("--prefill_workers=", prefill_->address),
         absl::StrCat("--decode_workers=", decode_->address), "--load_interval_ms=20"},
        TestTmpPath("router.log"));
    ASSERT_THAT(router, IsOk());
    router_ = new ServiceProcess(*router);
    // Requests sent before the first load reports are refused at once.
    ASSERT_TRUE(testing::RouterKnowsWorkers(*router_, {"prefill", "decode"}));
    generation_ = v1::Generation::NewStub(router_->channel).release();
  }

  static void TearDownTestSuite() {
    for (ServiceProcess* p : {router_, prefill_, decode_}) {
      if (p != nullptr) {
        EXPECT_THAT(testing::StopService(*p), IsOk());
      }
    }
  }

  // Runs a Generate to its end, retrying while admission rejects it (no load
  // reports yet); returns the final status and counts the rejections.
  // `cancel_after` > 0 cancels once that many tokens arrived.
  grpc::Status Generate(const v1::GenerateRequest& request, int* rejections, int* tokens,
                        int cancel_after = 0) {
    grpc::Status status;
    for (int attempt = 0; attempt < 200; ++attempt) {
      *tokens = 0;
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
      auto reader = generation_->Generate(&context, request);
      v1::GenerateResponse response;
      while (reader->Read(&response)) {
        if (!response.has_chunk()) continue;
        *tokens += response.chunk().token_ids_size();
        if (cancel_after > 0 && *tokens >= cancel_after) context.TryCancel();
      }
      status = reader->Finish();
      if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
      ++*rejections;
    }
    return status;
  }

  static v1::GenerateRequest Request(int prompt_tokens, int max_tokens) {
    v1::GenerateRequest request;
    for (int32_t id = 1; id <= prompt_tokens; ++id) request.mutable_token_ids()->add_ids(id);
    request.mutable_sampling()->set_temperature(0);
    request.mutable_sampling()->set_max_tokens(max_tokens);
    request.mutable_stop()->set_ignore_eos(true);
    return request;
  }

  static std::string* model_dir_;
  static ServiceProcess* prefill_;
  static ServiceProcess* decode_;
  static ServiceProcess* router_;
  static v1::Generation::Stub* generation_;
};

std::string* RouterMetricsTest::model_dir_ = nullptr;
ServiceProcess* RouterMetricsTest::prefill_ = nullptr;
ServiceProcess* RouterMetricsTest::decode_ = nullptr;
ServiceProcess* RouterMetricsTest::router_ = nullptr;
v1::Generation::Stub* RouterMetricsTest::generation_ = nullptr;

// Runs first (gtest keeps declaration order): the counts below are the
// suite's first generation's.
TEST_F(RouterMetricsTest, OneGenerationShowsOnTheRouterAndBothWorkers) {
  int rejections = 0;
  int tokens = 0;
  const grpc::Status status = Generate(Request(20, 5), &rejections, &tokens);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(tokens, 5);
  std::printf("admitted after %d rejections\n", rejections);

  // The router records the outcome before it streams the final message.
  const std::string router = Scrape(*router_);
  EXPECT_TRUE(Is(router, R"(trident_router_requests_total{class="default",outcome="ok"})", 1))
      << router;
  EXPECT_TRUE(Is(router, R"(trident_router_requests_total{class="default",outcome="error"})", 0));
  EXPECT_TRUE(Is(router, R"(trident_router_requests_total{class="default",outcome="rejected"})",
                 rejections));
  double rejected = 0;
  for (const char* reason : {"ttft", "tpot", "kv_capacity", "no_workers", "class_capacity"}) {
    const absl::optional<double> v = ValueOf(
        router, absl::StrCat(R"(trident_router_requests_rejected_total{class="default",reason=")",
                             reason, R"("})"));
    ASSERT_TRUE(v.has_value()) << reason;
    rejected += *v;
  }
  EXPECT_EQ(rejected, rejections);
  for (const char* h : {"ttft", "tpot", "e2e"}) {
    EXPECT_TRUE(
        Is(router, absl::StrCat("trident_router_", h, R"(_seconds_count{class="default"})"), 1))
        << h;
  }
  const absl::optional<double> ttft =
      ValueOf(router, R"(trident_router_ttft_seconds_sum{class="default"})");
  const absl::optional<double> e2e =
      ValueOf(router, R"(trident_router_e2e_seconds_sum{class="default"})");
  ASSERT_TRUE(ttft.has_value() && e2e.has_value());
  EXPECT_GT(*ttft, 0);
  EXPECT_LT(*ttft, *e2e);
  EXPECT_TRUE(Is(
      router,
      R"(trident_router_admission_predicted_ttft_seconds_count{class="default",decision="admitted"})",
      1));
  EXPECT_TRUE(Is(router, R"(trident_router_requests_in_flight{stage="prefill"})", 0));
  EXPECT_TRUE(Is(router, R"(trident_router_requests_in_flight{stage="decode"})", 0));
  EXPECT_TRUE(
      ValueOf(router, R"(trident_router_worker_kv_usage_ratio{worker="decode"})").has_value());
  EXPECT_TRUE(ValueOf(router, R"(trident_router_worker_queued_prefill_tokens{worker="prefill"})")
                  .has_value());

  // The prefill worker: one transfer, over the lane it reports.
  const std::string prefill = ScrapeUntil(*prefill_, [](const std::string& body) {
    return absl::StrContains(body, R"(outcome="ok"} 1)");
  });
  const std::string lane_prefix = R"(trident_worker_kv_lane_info{lane=")";
  const size_t at = prefill.find(lane_prefix);
  ASSERT_NE(at, std::string::npos) << prefill;
  const size_t begin = at + lane_prefix.size();
  const std::string lane = prefill.substr(begin, prefill.find('"', begin) - begin);
  std::printf("KV lane: %s\n", lane.c_str());
  EXPECT_FALSE(lane.empty());
  EXPECT_TRUE(Is(prefill, absl::StrCat(lane_prefix, lane, R"("})"), 1));
  EXPECT_TRUE(Is(
      prefill,
      absl::StrCat(R"(trident_worker_kv_transfers_total{lane=")", lane, R"(",outcome="ok"})"), 1))
      << prefill;
  const absl::optional<double> bytes = ValueOf(
      prefill,
      absl::StrCat(R"(trident_worker_kv_transfer_bytes_total{lane=")", lane, R"(",role="send"})"));
  ASSERT_TRUE(bytes.has_value()) << prefill;
  EXPECT_GT(*bytes, 0);
  EXPECT_TRUE(Is(prefill,
                 absl::StrCat(R"(trident_worker_kv_transfer_seconds_count{lane=")", lane, R"("})"),
                 1));

  // The decode worker: the reservation was handed over, none is held.
  const std::string decode = ScrapeUntil(*decode_, [](const std::string& body) {
    return Is(body, "trident_worker_kv_reservations", 0);
  });
  EXPECT_TRUE(Is(decode, "trident_worker_kv_reservations", 0)) << decode;
  EXPECT_TRUE(Is(decode, "trident_worker_kv_reserved_blocks", 0));
}

TEST_F(RouterMetricsTest, ACancelledGenerationCountsAsCancelled) {
  int rejections = 0;
  int tokens = 0;
  const grpc::Status status = Generate(Request(40, 200), &rejections, &tokens, /*cancel_after=*/2);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_LT(tokens, 200);
  const std::string router = ScrapeUntil(*router_, [](const std::string& body) {
    return Is(body, R"(trident_router_requests_total{class="default",outcome="cancelled"})", 1);
  });
  EXPECT_TRUE(
      Is(router, R"(trident_router_requests_total{class="default",outcome="cancelled"})", 1))
      << router;
  EXPECT_TRUE(Is(router, R"(trident_router_requests_in_flight{stage="prefill"})", 0));
  EXPECT_TRUE(Is(router, R"(trident_router_requests_in_flight{stage="decode"})", 0));
}

}  // namespace
}  // namespace trident
