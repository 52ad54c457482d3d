#include "common/controller_client/topology_watcher.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/controller_client/testing/fake_controller.h"
#include "common/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace trident::controller_client {
namespace {

namespace v1 = ::trident::v1;
using ::trident::testing::StatusIs;

constexpr absl::Duration kWait = absl::Seconds(30);

v1::RegisterRequest Worker(const std::string& id) {
  v1::RegisterRequest request;
  request.mutable_worker()->set_worker_id(id);
  request.mutable_worker()->set_incarnation(1);
  request.mutable_worker()->set_address(absl::StrCat(id, ".local:50052"));
  request.mutable_worker()->set_role(v1::ROLE_DECODE);
  return request;
}

std::unique_ptr<FakeControllerServer> StartController(uint64_t incarnation, int port = 0) {
  absl::StatusOr<std::unique_ptr<FakeControllerServer>> server =
      FakeControllerServer::Start({.controller_incarnation = incarnation}, port);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::vector<std::string> WorkerIds(const v1::Topology& topology) {
  std::vector<std::string> ids;
  for (const v1::WorkerEntry& entry : topology.workers()) {
    ids.push_back(entry.registration().worker_id());
  }
  return ids;
}

// Records what the callback got.
class Recorder {
 public:
  TopologyWatcher::Callback callback() {
    return [this](const v1::Topology& topology) {
      absl::MutexLock lock(&mu_);
      seen_.push_back(topology);
    };
  }
  std::vector<v1::Topology> seen() const {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<v1::Topology> seen_;
};

std::unique_ptr<TopologyWatcher> StartWatcher(const std::string& address, Recorder* recorder) {
  TopologyWatcherOptions options;
  options.controller_address = address;
  options.watcher_id = "router-test";
  options.backoff = {.initial = absl::Milliseconds(10), .max = absl::Milliseconds(100)};
  options.seed = 99;
  absl::StatusOr<std::unique_ptr<TopologyWatcher>> watcher =
      TopologyWatcher::Create(options, recorder->callback());
  EXPECT_TRUE(watcher.ok()) << watcher.status();
  if (!watcher.ok()) return nullptr;
  (*watcher)->Start();
  return *std::move(watcher);
}

TEST(TopologyWatcherTest, DeliversTheCurrentTopologyThenEachChange) {
  auto server = StartController(/*incarnation=*/4);
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->controller().AddMember(Worker("w1")).ok());
  Recorder recorder;
  auto watcher = StartWatcher(server->address(), &recorder);
  ASSERT_NE(watcher, nullptr);

  ASSERT_TRUE(
      watcher->Await([](const TopologyWatcherStatus& s) { return s.topologies >= 1; }, kWait));
  EXPECT_TRUE(watcher->connected());
  ASSERT_TRUE(watcher->last().has_value());
  EXPECT_EQ(WorkerIds(*watcher->last()), std::vector<std::string>{"w1"});
  EXPECT_EQ(server->controller().state().last_watch_request.watcher_id(), "router-test");

  ASSERT_TRUE(server->controller().AddMember(Worker("w2")).ok());

  ASSERT_TRUE(
      watcher->Await([](const TopologyWatcherStatus& s) { return s.topologies >= 2; }, kWait));
  const std::vector<v1::Topology> seen = recorder.seen();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(WorkerIds(seen[1]), (std::vector<std::string>{"w1", "w2"}));
  EXPECT_GT(seen[1].version(), seen[0].version());
  EXPECT_EQ(seen[1].controller_incarnation(), 4u);
  EXPECT_EQ(watcher->status().version, seen[1].version());
}

TEST(TopologyWatcherTest, KeepsTheLastTopologyWhileDownThenFollowsARestartedController) {
  auto server = StartController(/*incarnation=*/1);
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  ASSERT_TRUE(server->controller().AddMember(Worker("w1")).ok());
  Recorder recorder;
  auto watcher = StartWatcher(server->address(), &recorder);
  ASSERT_NE(watcher, nullptr);
  ASSERT_TRUE(
      watcher->Await([](const TopologyWatcherStatus& s) { return s.topologies >= 1; }, kWait));
  const uint64_t version = watcher->last()->version();

  server.reset();  // The controller goes away.

  ASSERT_TRUE(watcher->Await(
      [](const TopologyWatcherStatus& s) { return !s.connected && s.disconnects >= 1; }, kWait));
  ASSERT_TRUE(watcher->last().has_value());
  EXPECT_EQ(WorkerIds(*watcher->last()), std::vector<std::string>{"w1"});
  EXPECT_EQ(watcher->last()->version(), version);
  EXPECT_EQ(recorder.seen().size(), 1u);

  // A new controller comes up on the same address with its own incarnation
  // (and a lower version than the old one had reached).
  server = StartController(/*incarnation=*/2, port);
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->controller().AddMember(Worker("w2")).ok());

  ASSERT_TRUE(watcher->Await(
      [](const TopologyWatcherStatus& s) { return s.controller_incarnation == 2; }, kWait));
  EXPECT_TRUE(watcher->connected());
  EXPECT_EQ(WorkerIds(*watcher->last()), std::vector<std::string>{"w2"});
  // The reconnection named the topology it had.
  const v1::WatchTopologyRequest request = server->controller().state().last_watch_request;
  EXPECT_EQ(request.known_controller_incarnation(), 1u);
  EXPECT_EQ(request.known_version(), version);
  EXPECT_EQ(recorder.seen().back().controller_incarnation(), 2u);
}

TEST(TopologyWatcherTest, ReportsDisconnectedWhileTheControllerNeverAnswered) {
  int port = 0;
  {
    auto server = StartController(/*incarnation=*/1);
    ASSERT_NE(server, nullptr);
    port = server->port();
  }
  Recorder recorder;
  auto watcher = StartWatcher(absl::StrCat("127.0.0.1:", port), &recorder);
  ASSERT_NE(watcher, nullptr);

  ASSERT_TRUE(
      watcher->Await([](const TopologyWatcherStatus& s) { return s.disconnects >= 2; }, kWait));
  EXPECT_FALSE(watcher->connected());
  EXPECT_FALSE(watcher->last().has_value());
  EXPECT_THAT(watcher->status().last_error, StatusIs(absl::StatusCode::kUnavailable));
  watcher->Stop();
  EXPECT_TRUE(recorder.seen().empty());
}

TEST(TopologyWatcherTest, StopEndsTheStream) {
  auto server = StartController(/*incarnation=*/1);
  ASSERT_NE(server, nullptr);
  Recorder recorder;
  auto watcher = StartWatcher(server->address(), &recorder);
  ASSERT_NE(watcher, nullptr);
  ASSERT_TRUE(server->controller().Await(
      [](const FakeControllerState& s) { return s.open_watch_streams == 1; }, kWait));

  watcher->Stop();

  EXPECT_FALSE(watcher->connected());
  EXPECT_TRUE(server->controller().Await(
      [](const FakeControllerState& s) { return s.open_watch_streams == 0; }, kWait));
}

TEST(IsNewerTopologyTest, ComparesVersionsWithinAnIncarnationOnly) {
  v1::Topology current;
  current.set_controller_incarnation(1);
  current.set_version(10);
  v1::Topology candidate = current;
  EXPECT_TRUE(IsNewerTopology(candidate, std::nullopt));
  EXPECT_FALSE(IsNewerTopology(candidate, current));
  candidate.set_version(11);
  EXPECT_TRUE(IsNewerTopology(candidate, current));
  candidate.set_version(9);
  EXPECT_FALSE(IsNewerTopology(candidate, current));
  // A restarted controller counts again from low versions.
  candidate.set_controller_incarnation(2);
  candidate.set_version(1);
  EXPECT_TRUE(IsNewerTopology(candidate, current));
}

TEST(TopologyWatcherTest, CreateRejectsIncompleteOptions) {
  EXPECT_THAT(TopologyWatcher::Create({}, [](const v1::Topology&) {}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(TopologyWatcher::Create({.controller_address = "127.0.0.1:1"}, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace trident::controller_client
