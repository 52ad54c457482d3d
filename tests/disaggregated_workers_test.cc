// Disaggregated serving across real worker processes on loopback: a prefill
// worker (role prefill) writes each prompt's KV over UCX into blocks a
// decode worker (role decode) reserved, then the decode worker continues the
// sequence. The test plays the router (ReserveKv, Prefill with the
// destination, Decode on the reservation) and compares the tokens with a
// worker alone in role both, for every fixture prompt, over UCX's tcp and
// shared-memory (posix) transports. Afterwards both workers' KV blocks are
// all free.

#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/disaggregated_call.h"
#include "tests/testing/fixture_models.h"
#include "tests/testing/service_process.h"
#include "trident/v1/generation.grpc.pb.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::TestTmpPath;

using ::trident::testing::ServiceProcess;

// A worker in `role` on the fixture model; KV over UCX `transport` unless
// alone in role both.
absl::StatusOr<ServiceProcess> StartWorker(const std::string& model_dir, const std::string& role,
                                           const std::string& transport, const std::string& name) {
  std::vector<std::string> argv =
      testing::SmallCpuWorkerArgv(RunfilePath("services/worker/worker"), model_dir, role, name);
  if (role != "both") argv.push_back(absl::StrCat("--ucx_transports=", transport));
  return testing::StartService(argv, TestTmpPath(absl::StrCat(name, "-", transport, ".log")));
}

class DisaggregatedWorkersTest
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  const std::string& model() const { return std::get<0>(GetParam()); }
  const std::string& transport() const { return std::get<1>(GetParam()); }

  void SetUp() override {
    model_dir_ = TestTmpPath(model());
    ASSERT_THAT(testing::EnsureFixtureModel(model(), model_dir_), IsOk());
    for (auto [role, process] : {std::pair{"both", &both_}, std::pair{"prefill", &prefill_},
                                 std::pair{"decode", &decode_}}) {
      auto started = StartWorker(model_dir_, role, transport(), absl::StrCat(role, "-", model()));
      ASSERT_THAT(started, IsOk());
      *process = *started;
    }
  }

  void TearDown() override {
    for (ServiceProcess* p : {&both_, &prefill_, &decode_}) {
      EXPECT_THAT(testing::StopService(*p), IsOk());
    }
  }

  std::vector<int32_t> Alone(const std::vector<int32_t>& prompt, int32_t max_tokens) {
    auto stub = v1::Generation::NewStub(both_.channel);
    v1::GenerateRequest request;
    for (int32_t t : prompt) request.mutable_token_ids()->add_ids(t);
    request.mutable_sampling()->set_temperature(0);
    request.mutable_sampling()->set_max_tokens(max_tokens);
    request.mutable_stop()->set_ignore_eos(true);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto reader = stub->Generate(&context, request);
    std::vector<int32_t> tokens;
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      for (int32_t t : response.chunk().token_ids()) tokens.push_back(t);
    }
    EXPECT_TRUE(reader->Finish().ok());
    return tokens;
  }

  // The router's part: reserve, prefill into the reservation, decode.
  std::vector<int32_t> Disaggregated(const std::string& id, const std::vector<int32_t>& prompt,
                                     int32_t max_tokens, std::string* lane) {
    testing::DisaggregatedContexts contexts;
    const testing::DisaggregatedResult result =
        testing::GenerateDisaggregated(prefill_, decode_, id, prompt, max_tokens, &contexts);
    EXPECT_TRUE(result.reserve_status.ok()) << result.reserve_status.error_message();
    EXPECT_TRUE(result.prefill_status.ok()) << "prefill: " << result.prefill_status.error_message();
    EXPECT_TRUE(result.decode_status.ok()) << "decode: " << result.decode_status.error_message();
    *lane = result.lane;
    return result.tokens;
  }

  std::string model_dir_;
  ServiceProcess both_, prefill_, decode_;
};

TEST_P(DisaggregatedWorkersTest, TokensEqualTheWorkerAloneInRoleBoth) {
  std::ifstream in(RunfilePath(absl::StrCat("tests/fixtures/models/", model(), "/reference.json")));
  const nlohmann::json ref = nlohmann::json::parse(
      std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
  int n = 0;
  std::string lane;
  for (const auto& prompt : ref["prompts"]) {
    const auto ids = prompt["prompt_ids"].get<std::vector<int32_t>>();
    constexpr int32_t kMaxTokens = 24;
    const std::vector<int32_t> alone = Alone(ids, kMaxTokens);
    ASSERT_EQ(alone.size(), static_cast<size_t>(kMaxTokens));
    EXPECT_EQ(Disaggregated(absl::StrCat("p", n), ids, kMaxTokens, &lane), alone)
        << "prompt " << n << " (" << ids.size() << " tokens)";
    ++n;
  }
  std::printf("%s over %s: %d prompts equal, KV over UCX lane '%s'\n", model().c_str(),
              transport().c_str(), n, lane.c_str());
  EXPECT_FALSE(lane.empty());
  EXPECT_TRUE(testing::AllKvBlocksFree(prefill_));
  EXPECT_TRUE(testing::AllKvBlocksFree(decode_));
}

INSTANTIATE_TEST_SUITE_P(ModelsAndTransports, DisaggregatedWorkersTest,
                         ::testing::Combine(::testing::Values("llama3-tiny", "qwen2-tiny",
                                                              "mistral-tiny"),
                                            ::testing::Values("tcp", "posix")),
                         testing::ModelTransportName);

}  // namespace
}  // namespace trident
