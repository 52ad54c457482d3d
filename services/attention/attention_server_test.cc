// An AttentionServer built in this process (one kernel thread, a small KV
// budget, UCX over tcp) joins a fake controller: it registers what it is,
// heartbeats its store's load and deregisters when it leaves.

#include "services/attention/attention_server.h"

#include <memory>

#include "common/controller_client/member_address.h"
#include "common/controller_client/testing/fake_controller.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace trident::attention {
namespace {

namespace v1 = ::trident::v1;
using ::trident::testing::IsOk;

AttentionServerOptions SmallServer() {
  AttentionServerOptions options;
  options.service_id = "attention-t";
  options.threads = 1;
  options.kv_budget_bytes = int64_t{16} << 20;
  options.ucx_transports = "tcp";
  options.spin_window = absl::Microseconds(100);
  return options;
}

TEST(AttentionServerTest, JoinsTheControllerWithWhatItIsAndItsLoadThenLeavesIt) {
  absl::StatusOr<std::unique_ptr<controller_client::FakeControllerServer>> controller =
      controller_client::FakeControllerServer::Start({.controller_incarnation = 2});
  ASSERT_THAT(controller.status(), IsOk());
  controller_client::FakeController& fake = (*controller)->controller();
  AttentionServerOptions options = SmallServer();
  options.controller_address = (*controller)->address();
  options.controller_backoff = {.initial = absl::Milliseconds(10), .max = absl::Milliseconds(100)};
  prometheus::Registry registry;
  absl::StatusOr<std::unique_ptr<AttentionServer>> server =
      AttentionServer::Create(options, &registry);
  ASSERT_THAT(server.status(), IsOk());

  ASSERT_THAT((*server)->JoinController({.address = "127.0.0.1:50053",
                                         .metrics_address = "127.0.0.1:9403",
                                         .node_name = "cpu-node"}),
              IsOk());

  ASSERT_TRUE(fake.Await(
      [](const controller_client::FakeControllerState& s) {
        return s.Member("attention-t").heartbeats >= 2;
      },
      absl::Seconds(30)));
  const controller_client::FakeMemberRecord record = fake.state().Member("attention-t");
  const v1::AttentionRegistration& registration = record.last_registration.attention();
  EXPECT_NE(registration.incarnation(), 0u);
  EXPECT_EQ(registration.address(), "127.0.0.1:50053");
  EXPECT_EQ(registration.node_name(), "cpu-node");
  EXPECT_EQ(registration.numa_node(), (*server)->numa_node());
  EXPECT_EQ(registration.threads(), 1);
  EXPECT_EQ(registration.capacity_bytes(), int64_t{16} << 20);
  EXPECT_FALSE(registration.isa().empty());
  EXPECT_EQ(record.last_heartbeat.state(), v1::SERVING_STATE_SERVING);
  EXPECT_EQ(record.last_heartbeat.attention_load().sequences(), 0);
  EXPECT_GT(record.last_heartbeat.attention_load().capacity_bytes(), 0);
  ASSERT_EQ(fake.state().topology.attention_services_size(), 1);

  (*server)->LeaveController();

  EXPECT_EQ(fake.state().Member("attention-t").deregistrations, 1);
  EXPECT_EQ(fake.state().topology.attention_services_size(), 0);
}

TEST(AttentionServerTest, WithoutAControllerAddressJoiningDoesNothing) {
  prometheus::Registry registry;
  absl::StatusOr<std::unique_ptr<AttentionServer>> server =
      AttentionServer::Create(SmallServer(), &registry);
  ASSERT_THAT(server.status(), IsOk());

  EXPECT_THAT((*server)->JoinController({.address = "127.0.0.1:1"}), IsOk());

  EXPECT_EQ((*server)->ControllerMemberForTesting(), nullptr);
}

}  // namespace
}  // namespace trident::attention
