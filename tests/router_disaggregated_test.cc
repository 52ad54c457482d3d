// The whole disaggregated path through real processes on loopback: client ->
// router (admission, tokenization, streaming) -> prefill worker -> KV over
// UCX -> decode worker. Generations equal the fixture's greedy tokens (which
// a worker alone in role `both` reproduces: worker_generate_test); a
// cancelled stream frees every KV block on both workers.

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/runfiles.h"
#include "tests/testing/service_process.h"
#include "tools/make_model/model_gen.h"
#include "trident/v1/generation.grpc.pb.h"

namespace trident {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::ServiceProcess;
using ::trident::testing::TestTmpPath;

class RouterDisaggregatedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_dir_ = new std::string(TestTmpPath("llama3-tiny"));
    auto spec = make_model::PresetSpec("llama3-tiny");
    ASSERT_THAT(spec.status(), IsOk());
    ASSERT_THAT(make_model::WriteModel(*spec, *model_dir_), IsOk());
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
    generation_ = v1::Generation::NewStub(router_->channel).release();
  }

  static void TearDownTestSuite() {
    for (ServiceProcess* p : {router_, prefill_, decode_}) {
      if (p != nullptr) {
        EXPECT_THAT(testing::StopService(*p), IsOk());
      }
    }
  }

  struct Result {
    std::vector<int32_t> tokens;
    v1::GenerateComplete complete;
    grpc::Status status;
  };

  // Runs a Generate to its end, retrying while the router has no load
  // reports yet (RESOURCE_EXHAUSTED, at once, as admission promises).
  // `cancel_after` > 0 cancels once that many tokens arrived.
  Result Generate(const v1::GenerateRequest& request, int cancel_after = 0) {
    Result r;
    for (int attempt = 0; attempt < 200; ++attempt) {
      r = Result();
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
      auto reader = generation_->Generate(&context, request);
      v1::GenerateResponse response;
      while (reader->Read(&response)) {
        if (response.has_chunk()) {
          for (int32_t t : response.chunk().token_ids()) r.tokens.push_back(t);
          if (cancel_after > 0 && static_cast<int>(r.tokens.size()) >= cancel_after) {
            context.TryCancel();
          }
        } else {
          r.complete = response.complete();
        }
      }
      r.status = reader->Finish();
      if (r.status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
    }
    return r;
  }

  static std::string* model_dir_;
  static ServiceProcess* prefill_;
  static ServiceProcess* decode_;
  static ServiceProcess* router_;
  static v1::Generation::Stub* generation_;
};

std::string* RouterDisaggregatedTest::model_dir_ = nullptr;
ServiceProcess* RouterDisaggregatedTest::prefill_ = nullptr;
ServiceProcess* RouterDisaggregatedTest::decode_ = nullptr;
ServiceProcess* RouterDisaggregatedTest::router_ = nullptr;
v1::Generation::Stub* RouterDisaggregatedTest::generation_ = nullptr;

TEST_F(RouterDisaggregatedTest, GreedyTokensEqualTheFixtureThroughRouterPrefillAndDecode) {
  std::ifstream in(RunfilePath("tests/fixtures/models/llama3-tiny/reference.json"));
  const nlohmann::json ref = nlohmann::json::parse(
      std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
  int n = 0;
  for (const auto& prompt : ref["prompts"]) {
    v1::GenerateRequest request;
    for (int32_t id : prompt["prompt_ids"]) request.mutable_token_ids()->add_ids(id);
    const auto greedy = prompt["greedy"].get<std::vector<int32_t>>();
    request.mutable_sampling()->set_temperature(0);
    request.mutable_sampling()->set_max_tokens(static_cast<int32_t>(greedy.size()));
    request.mutable_stop()->set_ignore_eos(true);
    const Result r = Generate(request);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, greedy) << "prompt " << n;
    EXPECT_EQ(r.complete.finish_reason(), v1::FINISH_REASON_LENGTH);
    ++n;
  }
  EXPECT_EQ(n, 8);
  EXPECT_TRUE(testing::AllKvBlocksFree(*prefill_));
  EXPECT_TRUE(testing::AllKvBlocksFree(*decode_));
}

TEST_F(RouterDisaggregatedTest, CancellingMidStreamFreesEveryBlockOnBothWorkers) {
  v1::GenerateRequest request;
  for (int32_t id = 1; id <= 40; ++id) request.mutable_token_ids()->add_ids(id);
  request.mutable_sampling()->set_temperature(0);
  request.mutable_sampling()->set_max_tokens(200);
  request.mutable_stop()->set_ignore_eos(true);
  const Result r = Generate(request, /*cancel_after=*/3);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_GE(r.tokens.size(), 3u);
  EXPECT_LT(r.tokens.size(), 200u);
  EXPECT_TRUE(testing::AllKvBlocksFree(*prefill_));
  EXPECT_TRUE(testing::AllKvBlocksFree(*decode_));
}

}  // namespace
}  // namespace trident
