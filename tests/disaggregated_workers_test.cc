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
  std::vector<std::string> argv = {RunfilePath("services/worker/worker"),
                                   absl::StrCat("--role=", role),
                                   absl::StrCat("--worker_id=", name),
                                   "--pin_threads=false",
                                   "--cpu_threads=1",
                                   "--kv_cache_mb=16",
                                   absl::StrCat("--model=", model_dir)};
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
    auto decode = v1::Decode::NewStub(decode_.channel);
    auto prefill = v1::Prefill::NewStub(prefill_.channel);
    v1::ReserveKvRequest reserve;
    reserve.set_request_id(id);
    reserve.set_num_tokens(static_cast<int32_t>(prompt.size()));
    reserve.set_max_total_tokens(static_cast<int32_t>(prompt.size()) + max_tokens);
    v1::ReserveKvResponse reserved;
    {
      grpc::ClientContext context;
      const grpc::Status s = decode->ReserveKv(&context, reserve, &reserved);
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (!s.ok()) return {};
    }
    v1::KvDestination destination = reserved.destination();
    destination.set_decode_address(decode_.address);
    v1::DecodeRequest d;
    d.set_request_id(id);
    d.set_reservation_id(destination.reservation_id());
    d.set_decode_incarnation(destination.decode_incarnation());
    v1::PrefillRequest p;
    p.set_request_id(id);
    for (int32_t t : prompt) {
      d.add_prompt_token_ids(t);
      p.add_prompt_token_ids(t);
    }
    d.mutable_sampling()->set_temperature(0);
    d.mutable_sampling()->set_max_tokens(max_tokens);
    d.mutable_stop()->set_ignore_eos(true);
    *p.mutable_sampling() = d.sampling();
    *p.mutable_stop() = d.stop();
    *p.mutable_destination() = destination;

    grpc::ClientContext decode_context;
    decode_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto decode_reader = decode->Decode(&decode_context, d);
    grpc::ClientContext prefill_context;
    prefill_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto prefill_reader = prefill->Prefill(&prefill_context, p);
    std::vector<int32_t> tokens;
    v1::PrefillResponse pr;
    while (prefill_reader->Read(&pr)) {
      for (int32_t t : pr.first_token().token_ids()) tokens.push_back(t);
      if (pr.has_transfer_done()) *lane = pr.transfer_done().lane();
    }
    const grpc::Status ps = prefill_reader->Finish();
    EXPECT_TRUE(ps.ok()) << "prefill: " << ps.error_message();
    v1::DecodeResponse dr;
    while (decode_reader->Read(&dr)) {
      for (int32_t t : dr.chunk().token_ids()) tokens.push_back(t);
    }
    const grpc::Status ds = decode_reader->Finish();
    EXPECT_TRUE(ds.ok()) << "decode: " << ds.error_message();
    return tokens;
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
