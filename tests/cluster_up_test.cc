// End to end: `trident up` starts the whole disaggregated cluster on loopback
// (a prefill and a decode worker behind the router) with a real Prometheus;
// every service answers grpc.health.v1 and server reflection, a generation
// streams through the router, `trident status` shows the workers' roles, and
// Prometheus scrapes every /metrics with up == 1. Then `trident down` stops
// it.

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc/health_client.h"
#include "common/http/http_client.h"
#include "common/process/subprocess.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tools/cli/cluster.h"
#include "tools/cli/generate.h"

namespace trident {
namespace {

using ::testing::Contains;
using ::testing::ContainsRegex;
using ::testing::IsSupersetOf;
using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::TestTmpPath;
using json = nlohmann::json;
namespace v1 = ::trident::v1;

// Runs `trident <args...>` and returns its exit code.
int RunTrident(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv = {RunfilePath("tools/cli/trident")};
  argv.insert(argv.end(), args.begin(), args.end());
  absl::StatusOr<SpawnedProcess> spawned = Spawn({.argv = argv, .log_path = log});
  if (!spawned.ok()) {
    ADD_FAILURE() << spawned.status();
    return -1;
  }
  absl::StatusOr<ExitInfo> exit = WaitForExit(spawned->pid, absl::Minutes(4));
  if (!exit.ok()) {
    ADD_FAILURE() << exit.status() << "\n" << TailOfFile(log);
    return -1;
  }
  if (exit->exit_code != 0) ADD_FAILURE() << "trident failed:\n" << TailOfFile(log);
  return exit->exit_code;
}

// Lists the services that `address` announces through server reflection.
absl::StatusOr<std::set<std::string>> ListServicesByReflection(const std::string& address) {
  using ::grpc::reflection::v1alpha::ServerReflection;
  using ::grpc::reflection::v1alpha::ServerReflectionRequest;
  using ::grpc::reflection::v1alpha::ServerReflectionResponse;
  auto stub =
      ServerReflection::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stream = stub->ServerReflectionInfo(&context);
  ServerReflectionRequest request;
  request.set_list_services("");
  ServerReflectionResponse response;
  if (!stream->Write(request) || !stream->Read(&response)) {
    return absl::UnavailableError(absl::StrCat("reflection stream to ", address, " failed"));
  }
  stream->WritesDone();
  std::set<std::string> names;
  for (const auto& service : response.list_services_response().service()) {
    names.insert(service.name());
  }
  grpc::Status status = stream->Finish();
  if (!status.ok()) return absl::UnavailableError(status.error_message());
  return names;
}

// Waits until Prometheus reports `expected` active targets, all healthy.
// Prometheus only exposes scrape results over HTTP, so this polls its API
// until a deadline; each scrape happens every 500 ms.
json WaitForHealthyTargets(const std::string& prometheus_url, size_t expected) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  json targets;
  while (absl::Now() < deadline) {
    auto response = http::Get(prometheus_url + "/api/v1/targets");
    if (response.ok() && response->status_code == 200) {
      targets = json::parse(response->body, nullptr, false)["data"]["activeTargets"];
      size_t healthy = 0;
      for (const json& target : targets) healthy += target["health"] == "up";
      if (targets.size() == expected && healthy == expected) return targets;
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  ADD_FAILURE() << "Prometheus targets never all became healthy: " << targets.dump(2);
  return targets;
}

// The result of the instant query `query` once it holds `expected` series:
// a target reported healthy may still have its scrape's samples on the way
// into the queryable head, so one query right after the targets can miss
// them.
json WaitForQueryResult(const std::string& prometheus_url, const std::string& query,
                        size_t expected) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  json result;
  while (absl::Now() < deadline) {
    auto response = http::Get(prometheus_url + "/api/v1/query?query=" + http::UrlEncode(query));
    if (response.ok() && response->status_code == 200) {
      result = json::parse(response->body, nullptr, false)["data"]["result"];
      if (result.size() == expected) return result;
    }
    absl::SleepFor(absl::Milliseconds(250));
  }
  ADD_FAILURE() << "the query " << query << " never held " << expected
                << " series: " << result.dump(2);
  return result;
}

TEST(ClusterUpTest, AllServicesServeHealthReflectionAndMetrics) {
  const std::string state_dir = TestTmpPath("cluster");
  const std::string log = TestTmpPath("trident.log");
  // The default cluster: one prefill and one decode worker.
  // Every sequence of 64 tokens or more goes to the attention service (the
  // default places there only when the KV pool runs short).
  ASSERT_EQ(RunTrident({"up", "--state_dir=" + state_dir, "--scrape_interval=500ms",
                        "--offload_min_context_tokens=64"},
                       log),
            0);
  absl::StatusOr<cli::ClusterState> state = cli::LoadState(state_dir);
  ASSERT_THAT(state, IsOk());

  // 1. grpc.health.v1: the server as a whole and every service it hosts.
  const std::vector<std::pair<std::string, std::vector<std::string>>> expected_services = {
      {"controller", {"trident.v1.Controller"}},
      {"attention-0", {"trident.v1.Attention"}},
      {"worker-0", {"trident.v1.Prefill", "trident.v1.Decode", "trident.v1.WorkerControl"}},
      {"worker-1", {"trident.v1.Prefill", "trident.v1.Decode", "trident.v1.WorkerControl"}},
      {"router", {"trident.v1.Generation"}},
  };
  for (const auto& [name, services] : expected_services) {
    const cli::ProcessRecord* record = state->Find(name);
    ASSERT_NE(record, nullptr) << name;
    const std::string address = record->GrpcAddress(state->host);
    EXPECT_THAT(CheckHealth(address, ""), ::trident::testing::IsOkAndHolds(ServingStatus::kServing))
        << name;
    for (const std::string& service : services) {
      EXPECT_THAT(CheckHealth(address, service),
                  ::trident::testing::IsOkAndHolds(ServingStatus::kServing))
          << name << " " << service;
    }
    // 2. Server reflection lists what the process serves.
    absl::StatusOr<std::set<std::string>> listed = ListServicesByReflection(address);
    ASSERT_THAT(listed, IsOk()) << name;
    EXPECT_THAT(*listed, IsSupersetOf(services)) << name;
    EXPECT_THAT(*listed, Contains("grpc.health.v1.Health")) << name;
  }

  // 3. A generation streams through the router: prefill on worker-0, KV to
  // worker-1 over UCX, decode there.
  absl::StatusOr<cli::GenerateSummary> generated =
      cli::StreamGeneration({.address = state->RouterAddress(),
                             .prompt = "Once upon a time",
                             .max_tokens = 8,
                             .ignore_eos = true,
                             .timeout = absl::Seconds(60)},
                            /*out=*/nullptr);
  ASSERT_THAT(generated, IsOk());
  EXPECT_EQ(generated->tokens, 8);
  EXPECT_FALSE(generated->text.empty());
  EXPECT_EQ(generated->complete.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(generated->complete.usage().completion_tokens(), 8);
  // A generation whose context passes 64 tokens is placed at the attention
  // service (--offload_min_context_tokens=64 above), and says so.
  absl::StatusOr<cli::GenerateSummary> offloaded =
      cli::StreamGeneration({.address = state->RouterAddress(),
                             .prompt = "Once upon a time",
                             .max_tokens = 80,
                             .ignore_eos = true,
                             .timeout = absl::Seconds(60)},
                            /*out=*/nullptr);
  ASSERT_THAT(offloaded, IsOk());
  EXPECT_EQ(offloaded->tokens, 80);
  EXPECT_EQ(offloaded->complete.placement().attention_service_id(), "attention-0");
  // `trident generate` goes through the router by default.
  const std::string generate_log = TestTmpPath("generate.log");
  EXPECT_EQ(RunTrident({"generate", "Once upon a time", "--state_dir=" + state_dir,
                        "--max_tokens=4", "--ignore_eos"},
                       generate_log),
            0);
  EXPECT_THAT(TailOfFile(generate_log), ContainsRegex("4 generated, finish length"));

  // 4. Prometheus scrapes every service's /metrics: targets up, and up == 1.
  const json targets = WaitForHealthyTargets(state->PrometheusUrl(), expected_services.size());
  std::set<std::string> scraped_jobs;
  for (const json& target : targets) scraped_jobs.insert(target["labels"]["job"]);
  EXPECT_EQ(scraped_jobs, (std::set<std::string>{"router", "worker", "attention", "controller"}));
  const json result = WaitForQueryResult(state->PrometheusUrl(), "up", expected_services.size());
  ASSERT_EQ(result.size(), expected_services.size());
  for (const json& sample : result) {
    EXPECT_EQ(sample["value"][1], "1") << sample.dump();
  }
  // Each service exports its build info, so the scrape carried real metrics.
  EXPECT_EQ(WaitForQueryResult(state->PrometheusUrl(), "trident_router_build_info", 1).size(), 1u);

  // `trident status` agrees, and shows each worker's role and load.
  const std::string status_log = TestTmpPath("status.log");
  EXPECT_EQ(RunTrident({"status", "--state_dir=" + state_dir}, status_log), 0);
  const std::string status = TailOfFile(status_log, 1 << 16);
  EXPECT_THAT(status, ContainsRegex("\nworker-0 +prefill +serving +[0-9]+ +[0-9]+ +[0-9.]+%"))
      << status;
  EXPECT_THAT(status, ContainsRegex("\nworker-1 +decode +serving +[0-9]+ +[0-9]+ +[0-9.]+%"))
      << status;
  // The controller's view: every member registered, with its role.
  EXPECT_THAT(status, ContainsRegex("CONTROLLER\n  incarnation [0-9]+, decisions every 10s from "
                                    "http://127.0.0.1:[0-9]+"))
      << status;
  EXPECT_THAT(status, ContainsRegex("member worker-0 +prefill +serving")) << status;
  EXPECT_THAT(status, ContainsRegex("member worker-1 +decode +serving")) << status;
  EXPECT_THAT(status, ContainsRegex("member attention-0 +attention +serving")) << status;

  // `trident down` stops every process.
  EXPECT_EQ(RunTrident({"down", "--state_dir=" + state_dir}, log), 0);
  for (const cli::ProcessRecord& record : state->processes) {
    EXPECT_FALSE(IsRunning(record.pid)) << record.name;
  }
  EXPECT_THAT(cli::LoadState(state_dir), ::trident::testing::StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace trident
