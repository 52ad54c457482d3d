#include "tools/cli/cluster.h"

#include <cstdlib>
#include <string>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::cli {
namespace {

using ::testing::HasSubstr;
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

}  // namespace
}  // namespace trident::cli
