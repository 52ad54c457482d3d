#include "common/telemetry/metrics_server.h"

#include "absl/strings/str_cat.h"
#include "common/http/http_client.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"

namespace trident::telemetry {
namespace {

using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

TEST(MetricsServerTest, ServesRegisteredMetricsOnAFreePort) {
  auto server = MetricsServer::Start({.host = "127.0.0.1", .port = 0, .component = "router"});
  ASSERT_THAT(server, IsOk());
  ASSERT_GT((*server)->port(), 0);
  prometheus::BuildCounter()
      .Name("trident_router_requests_total")
      .Help("Requests.")
      .Register((*server)->registry())
      .Add({{"qos_class", "standard"}})
      .Increment(3);

  auto response =
      http::Get(absl::StrCat("http://127.0.0.1:", (*server)->port(), "/metrics"));
  ASSERT_THAT(response, IsOk());
  EXPECT_EQ(response->status_code, 200);
  EXPECT_THAT(response->body, HasSubstr("trident_router_requests_total{qos_class=\"standard\"} 3"));
  EXPECT_THAT(response->body, HasSubstr("trident_router_build_info{version=\""));
  EXPECT_THAT(response->body, HasSubstr("trident_router_start_time_seconds "));
}

TEST(MetricsServerTest, RefusesATakenPort) {
  auto first = MetricsServer::Start({.host = "127.0.0.1", .port = 0, .component = "worker"});
  ASSERT_THAT(first, IsOk());
  EXPECT_THAT(
      MetricsServer::Start({.host = "127.0.0.1", .port = (*first)->port(), .component = "worker"}),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot serve /metrics")));
}

TEST(MetricsServerTest, RejectsBadComponentNames) {
  EXPECT_THAT(MetricsServer::Start({.host = "127.0.0.1", .port = 0, .component = "Bad-Name"}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(MetricsServer::Start({.host = "127.0.0.1", .port = -2, .component = "worker"}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace trident::telemetry
