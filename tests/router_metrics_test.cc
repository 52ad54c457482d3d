// Metrics of disaggregated serving through real processes on loopback
// (router -> prefill worker -> KV over UCX -> decode worker): after one
// generation the router's /metrics counts it (outcome, TTFT, TPOT, E2E,
// in-flight stages, rejections while no load had arrived, worker gauges),
// the prefill worker's counts one KV transfer over the lane it logs, and the
// decode worker's reservation gauge returns to 0; a cancelled generation
// counts as cancelled.

#include <signal.h>

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
#include "common/process/subprocess.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/runfiles.h"
#include "tools/make_model/model_gen.h"
#include "trident/v1/generation.grpc.pb.h"

namespace trident {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::TestTmpPath;

struct Service {
  pid_t pid = -1;
  std::string address;  // 127.0.0.1:<grpc port>
  int metrics_port = 0;
};

absl::StatusOr<Service> Start(std::vector<std::string> argv, const std::string& log) {
  argv.push_back("--host=127.0.0.1");
  argv.push_back("--port=0");
  argv.push_back("--metrics_port=0");
  absl::StatusOr<SpawnedProcess> spawned =
      Spawn({.argv = argv, .log_path = TestTmpPath(log), .wait_for_ready_line = true});
  if (!spawned.ok()) return spawned.status();
  const nlohmann::json ready = nlohmann::json::parse(spawned->ready_line);
  Service s;
  s.pid = spawned->pid;
  s.address = absl::StrCat("127.0.0.1:", ready["grpc_port"].get<int>());
  s.metrics_port = ready["metrics_port"].get<int>();
  return s;
}

// The value of the series written exactly as `series` (name and labels in
// the exposition's order, which is by label name) in a /metrics body.
absl::optional<double> ValueOf(const std::string& body, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (!absl::ConsumePrefix(&line, series) || !absl::ConsumePrefix(&line, " ")) continue;
    double v;
    if (absl::SimpleAtod(line.substr(0, line.find(' ')), &v)) return v;
  }
  return absl::nullopt;
}

std::string Scrape(const Service& s) {
  absl::StatusOr<http::HttpResponse> r =
      http::Get(absl::StrCat("http://127.0.0.1:", s.metrics_port, "/metrics"));
  if (!r.ok() || r->status_code != 200) return "";
  return r->body;
}

// Scrapes `s` until `done` holds for the body (returned), or 20 s passed
// (the last body). What a process records after the client saw the end of
// its stream (the prefill worker's transfer, a cancellation on the router)
// lands a moment later.
std::string ScrapeUntil(const Service& s, const std::function<bool(const std::string&)>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::string body;
  do {
    body = Scrape(s);
    if (done(body)) break;
  } while (absl::Now() < deadline);
  return body;
}

bool Is(const std::string& body, const std::string& series, double want) {
  const absl::optional<double> v = ValueOf(body, series);
  return v.has_value() && *v == want;
}

class RouterMetricsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ = new std::string(TestTmpPath("llama3-tiny"));
    auto spec = make_model::PresetSpec("llama3-tiny");
    ASSERT_THAT(spec.status(), IsOk());
    ASSERT_THAT(make_model::WriteModel(*spec, *model_dir_), IsOk());
    auto worker = [](const std::string& role) {
      return Start(
          {RunfilePath("services/worker/worker"), absl::StrCat("--role=", role),
           absl::StrCat("--worker_id=", role), "--pin_threads=false", "--cpu_threads=1",
           "--kv_cache_mb=16", "--ucx_transports=tcp", absl::StrCat("--model=", *model_dir_)},
          absl::StrCat(role, ".log"));
    };
    auto prefill = worker("prefill");
    ASSERT_THAT(prefill, IsOk());
    prefill_ = new Service(*prefill);
    auto decode = worker("decode");
    ASSERT_THAT(decode, IsOk());
    decode_ = new Service(*decode);
    auto router =
        Start({RunfilePath("services/router/router"), absl::StrCat("--model=", *model_dir_),
               absl::StrCat("--prefill_workers=", prefill_->address),
               absl::StrCat("--decode_workers=", decode_->address), "--load_interval_ms=20"},
              "router.log");
    ASSERT_THAT(router, IsOk());
    router_ = new Service(*router);
    generation_ = v1::Generation::NewStub(
                      grpc::CreateChannel(router_->address, grpc::InsecureChannelCredentials()))
                      .release();
  }

  static void TearDownTestSuite() {
    for (Service* p : {router_, prefill_, decode_}) {
      if (p == nullptr || p->pid <= 0) continue;
      kill(p->pid, SIGTERM);
      EXPECT_THAT(WaitForExit(p->pid, absl::Seconds(30)).status(), IsOk());
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
  static Service* prefill_;
  static Service* decode_;
  static Service* router_;
  static v1::Generation::Stub* generation_;
};

std::string* RouterMetricsTest::model_dir_ = nullptr;
Service* RouterMetricsTest::prefill_ = nullptr;
Service* RouterMetricsTest::decode_ = nullptr;
Service* RouterMetricsTest::router_ = nullptr;
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
