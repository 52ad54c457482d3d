#include "tools/cli/cluster.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

ClusterState TwoWorkerState() {
  ClusterState state{.host = "127.0.0.1"};
  state.processes = {
      {.name = "controller",
       .component = "controller",
       .pid = 1,
       .grpc_port = 5,
       .metrics_port = 6},
      {.name = "worker-0", .component = "worker", .pid = 2, .grpc_port = 7, .metrics_port = 8},
      {.name = "worker-1", .component = "worker", .pid = 3, .grpc_port = 9, .metrics_port = 10},
      {.name = "prometheus", .component = "prometheus", .pid = 4, .metrics_port = 9090},
  };
  return state;
}

TEST(PrometheusConfigTest, ScrapesEveryServiceOnceUnderItsComponentJob) {
  const std::string config = PrometheusConfig(TwoWorkerState(), absl::Milliseconds(500));
  EXPECT_THAT(config, HasSubstr("scrape_interval: 500ms"));
  EXPECT_THAT(config, HasSubstr("job_name: controller"));
  EXPECT_THAT(config, HasSubstr("- targets: ['127.0.0.1:6']"));
  EXPECT_THAT(config, HasSubstr("- targets: ['127.0.0.1:8']"));
  EXPECT_THAT(config, HasSubstr("- targets: ['127.0.0.1:10']"));
  EXPECT_THAT(config, HasSubstr("process: 'worker-1'"));
  // One job for both workers; Prometheus does not scrape itself here.
  EXPECT_EQ(config.find("job_name: worker"), config.rfind("job_name: worker"));
  EXPECT_THAT(config, ::testing::Not(HasSubstr("9090")));
}

TEST(ClusterStateTest, FindsProcessesAndPrometheusUrl) {
  const ClusterState state = TwoWorkerState();
  ASSERT_NE(state.Find("worker-1"), nullptr);
  EXPECT_EQ(state.Find("worker-1")->GrpcAddress(state.host), "127.0.0.1:9");
  EXPECT_EQ(state.Find("router"), nullptr);
  EXPECT_EQ(state.PrometheusUrl(), "http://127.0.0.1:9090");
}

TEST(ClusterTest, LoadStateWithoutAClusterIsNotFound) {
  EXPECT_THAT(LoadState(std::string(std::getenv("TEST_TMPDIR")) + "/empty"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("trident up")));
  EXPECT_THAT(Down(std::string(std::getenv("TEST_TMPDIR")) + "/empty"),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST(ClusterTest, UpRejectsUnknownWorkerRoles) {
  ClusterOptions options;
  options.state_dir = std::string(std::getenv("TEST_TMPDIR")) + "/bad_roles";
  options.worker_roles = {"both", "speculative"};
  EXPECT_THAT(Up(options), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("speculative")));
}

TEST(ValidateWorkerRolesTest, AcceptsEveryMixThatCanPrefillAndDecode) {
  const std::vector<std::vector<std::string>> mixes = {{"prefill", "decode"},
                                                       {"both"},
                                                       {"both", "decode"},
                                                       {"prefill", "decode", "decode"},
                                                       {"prefill", "both"}};
  for (const std::vector<std::string>& roles : mixes) {
    EXPECT_THAT(ValidateWorkerRoles(roles), IsOk()) << ::testing::PrintToString(roles);
  }
}

TEST(ValidateWorkerRolesTest, RefusesAMixWithoutPrefillOrDecode) {
  EXPECT_THAT(ValidateWorkerRoles({"prefill", "prefill"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("decode")));
  EXPECT_THAT(ValidateWorkerRoles({"decode"}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ValidateWorkerRoles({}), StatusIs(absl::StatusCode::kInvalidArgument));
}

ClusterState WorkersState(const std::vector<std::string>& roles) {
  ClusterState state{.host = "127.0.0.1"};
  state.processes.push_back({.name = "controller", .component = "controller", .grpc_port = 1});
  for (size_t i = 0; i < roles.size(); ++i) {
    state.processes.push_back({.name = absl::StrCat("worker-", i),
                               .component = "worker",
                               .grpc_port = static_cast<int>(100 + i),
                               .role = roles[i]});
  }
  return state;
}

TEST(RouterWorkersOfTest, ListsEachWorkerByWhatItCanDoAndBothInBothLists) {
  RouterWorkers workers = RouterWorkersOf(WorkersState({"prefill", "decode", "decode"}));
  EXPECT_THAT(workers.prefill, ElementsAre("127.0.0.1:100"));
  EXPECT_THAT(workers.decode, ElementsAre("127.0.0.1:101", "127.0.0.1:102"));

  workers = RouterWorkersOf(WorkersState({"both"}));
  EXPECT_THAT(workers.prefill, ElementsAre("127.0.0.1:100"));
  EXPECT_THAT(workers.decode, ElementsAre("127.0.0.1:100"));

  workers = RouterWorkersOf(WorkersState({"both", "decode"}));
  EXPECT_THAT(workers.prefill, ElementsAre("127.0.0.1:100"));
  EXPECT_THAT(workers.decode, ElementsAre("127.0.0.1:100", "127.0.0.1:101"));
}

TEST(RouterHasLoadOfTest, NeedsASeriesForEveryWorker) {
  const std::string metrics =
      "# TYPE trident_router_worker_running_sequences gauge\n"
      "trident_router_worker_running_sequences{worker=\"worker-0\"} 0\n"
      "trident_router_worker_kv_usage_ratio{worker=\"worker-1\"} 0\n";
  EXPECT_TRUE(RouterHasLoadOf(metrics, {"worker-0"}));
  EXPECT_FALSE(RouterHasLoadOf(metrics, {"worker-0", "worker-1"}));
  EXPECT_FALSE(RouterHasLoadOf("", {"worker-0"}));
  EXPECT_TRUE(RouterHasLoadOf("", {}));
}

TEST(ClusterStateTest, RouterAddress) {
  ClusterState state = WorkersState({"both"});
  EXPECT_EQ(state.RouterAddress(), "");
  state.processes.push_back({.name = "router", .component = "router", .grpc_port = 50});
  EXPECT_EQ(state.RouterAddress(), "127.0.0.1:50");
}

}  // namespace
}  // namespace trident::cli
