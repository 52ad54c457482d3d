// RouterServer on a generated model (make_model's llama3-tiny: config and
// tokenizer only matter here) following a fake controller's topology: the
// workers it lists (not DEAD) are followed beside the static ones, their
// load reaches admission, a DEAD one leaves, and the last topology's
// workers stay while the controller is away.

#include "services/router/router_server.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/controller_client/testing/fake_controller.h"
#include "common/model/generate/model_gen.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "services/worker/load_streams.h"
#include "services/worker/worker_services.h"

namespace trident::router {
namespace {

namespace v1 = ::trident::v1;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;
using Workers = std::map<std::string, std::string>;

constexpr absl::Duration kWait = absl::Seconds(30);

std::string FixtureModel() {
  const std::string dir = ::trident::testing::TestTmpPath("llama3-tiny");
  absl::StatusOr<model::generate::ModelSpec> spec = model::generate::PresetSpec("llama3-tiny");
  EXPECT_THAT(spec.status(), IsOk());
  if (spec.ok()) {
    EXPECT_THAT(model::generate::WriteModel(*spec, dir), IsOk());
  }
  return dir;
}

// A worker's WorkerControl whose load streams report `id` in role decode.
struct FakeWorker {
  explicit FakeWorker(std::string worker_id)
      : id(std::move(worker_id)),
        loads([this] {
          v1::WorkerLoad load;
          load.set_worker_id(id);
          load.set_role(v1::ROLE_DECODE);
          load.set_state(v1::SERVING_STATE_SERVING);
          return load;
        }),
        control(nullptr, &loads) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&control);
    server = builder.BuildAndStart();
  }
  ~FakeWorker() { server->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }

  const std::string id;
  worker::LoadStreams loads;
  worker::WorkerControlService control;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

v1::RegisterRequest WorkerAt(const std::string& id, const std::string& address) {
  v1::RegisterRequest request;
  request.mutable_worker()->set_worker_id(id);
  request.mutable_worker()->set_incarnation(1);
  request.mutable_worker()->set_address(address);
  request.mutable_worker()->set_role(v1::ROLE_DECODE);
  return request;
}

RouterServerOptions Options(const std::string& model_dir) {
  RouterServerOptions options;
  options.model_dir = model_dir;
  options.load.interval = absl::Milliseconds(10);
  options.load.retry = absl::Milliseconds(20);
  options.controller_backoff = {.initial = absl::Milliseconds(10), .max = absl::Milliseconds(100)};
  return options;
}

TEST(RouterServerTest, FollowsTheControllersLiveWorkersBesideTheStaticOnes) {
  FakeWorker worker("decode-a");
  ASSERT_NE(worker.server, nullptr);
  absl::StatusOr<std::unique_ptr<controller_client::FakeControllerServer>> controller =
      controller_client::FakeControllerServer::Start({.controller_incarnation = 5});
  ASSERT_THAT(controller.status(), IsOk());
  controller_client::FakeController& fake = (*controller)->controller();
  ASSERT_THAT(fake.AddMember(WorkerAt("decode-a", worker.address())), IsOk());
  // Registered but never reachable: followed all the same (reported down).
  ASSERT_THAT(fake.AddMember(WorkerAt("decode-b", "127.0.0.1:1")), IsOk());
  RouterServerOptions options = Options(FixtureModel());
  options.controller_address = (*controller)->address();
  options.prefill_workers = {"127.0.0.1:2"};
  prometheus::Registry registry;
  absl::StatusOr<std::unique_ptr<RouterServer>> router =
      RouterServer::Create(std::move(options), &registry);
  ASSERT_THAT(router.status(), IsOk());
  const controller_client::TopologyWatcher* watcher = (*router)->TopologyWatcherForTesting();
  ASSERT_NE(watcher, nullptr);

  ASSERT_TRUE(watcher->Await(
      [](const controller_client::TopologyWatcherStatus& s) { return s.topologies >= 1; }, kWait));
  EXPECT_THAT((*router)->WorkerAddresses(),
              ElementsAre("127.0.0.1:1", "127.0.0.1:2", worker.address()));
  // The topology's worker is admitted on its own load stream.
  const std::string address = worker.address();
  ASSERT_TRUE((*router)->AwaitLiveWorkers(
      [&](const Workers& live) { return live.count(address) > 0; }, kWait));
  EXPECT_EQ((*router)->LiveWorkers().at(address), "decode-a");
  EXPECT_TRUE((*router)->AdmissionForTesting().ModelsOf("decode-a").has_value());

  // Marked DEAD: no longer followed, and out of admission's choices.
  const uint64_t before = watcher->status().version;
  ASSERT_THAT(fake.SetWorkerState("decode-a", v1::SERVING_STATE_DEAD), IsOk());
  ASSERT_TRUE(watcher->Await(
      [&](const controller_client::TopologyWatcherStatus& s) { return s.version > before; },
      kWait));
  EXPECT_THAT((*router)->WorkerAddresses(), ElementsAre("127.0.0.1:1", "127.0.0.1:2"));
  ASSERT_TRUE((*router)->AwaitLiveWorkers(
      [&](const Workers& live) { return live.count(address) == 0; }, kWait));

  // The controller goes away: the last topology's workers stay followed.
  (*controller)->Shutdown();
  ASSERT_TRUE(watcher->Await(
      [](const controller_client::TopologyWatcherStatus& s) {
        return !s.connected && s.disconnects >= 1;
      },
      kWait));
  EXPECT_THAT((*router)->WorkerAddresses(), ElementsAre("127.0.0.1:1", "127.0.0.1:2"));
}

TEST(RouterServerTest, WithoutAControllerFollowsTheStaticWorkers) {
  FakeWorker worker("both-0");
  ASSERT_NE(worker.server, nullptr);
  RouterServerOptions options = Options(FixtureModel());
  options.prefill_workers = {worker.address()};
  options.decode_workers = {worker.address()};
  prometheus::Registry registry;
  absl::StatusOr<std::unique_ptr<RouterServer>> router =
      RouterServer::Create(std::move(options), &registry);
  ASSERT_THAT(router.status(), IsOk());

  EXPECT_EQ((*router)->TopologyWatcherForTesting(), nullptr);
  EXPECT_THAT((*router)->WorkerAddresses(), ElementsAre(worker.address()));
  const std::string address = worker.address();
  EXPECT_TRUE((*router)->AwaitLiveWorkers(
      [&](const Workers& live) { return live.count(address) > 0; }, kWait));
  ASSERT_EQ((*router)->services().size(), 1u);
  EXPECT_EQ((*router)->services()[0].name, v1::Generation::service_full_name());
}

TEST(RouterServerTest, NeedsWorkersOrAController) {
  prometheus::Registry registry;
  EXPECT_THAT(RouterServer::Create(Options(FixtureModel()), &registry).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--prefill_workers")));

  RouterServerOptions with_controller = Options(FixtureModel());
  with_controller.controller_address = "127.0.0.1:1";
  absl::StatusOr<std::unique_ptr<RouterServer>> router =
      RouterServer::Create(std::move(with_controller), &registry);
  ASSERT_THAT(router.status(), IsOk());
  EXPECT_TRUE((*router)->WorkerAddresses().empty());
}

TEST(RouterServerTest, RejectsOutOfRangeOptionsNamingTheFlag) {
  prometheus::Registry registry;
  RouterServerOptions no_model = Options("");
  no_model.decode_workers = {"127.0.0.1:1"};
  EXPECT_THAT(RouterServer::Create(no_model, &registry).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--model")));
  RouterServerOptions margin = Options(FixtureModel());
  margin.decode_workers = {"127.0.0.1:1"};
  margin.slo_margin = 1.5;
  EXPECT_THAT(RouterServer::Create(margin, &registry).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--slo_margin")));
}

}  // namespace
}  // namespace trident::router
