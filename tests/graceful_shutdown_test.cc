// SIGTERM makes every service drain and exit with status 0 within 5 s, also
// with a streaming call (a grpc.health.v1 Watch) in flight, which is told
// NOT_SERVING and then ended, rather than held until the drain deadline.

#include <signal.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model/generate/model_gen.h"
#include "common/process/subprocess.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace trident {
namespace {

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::TestTmpPath;

class GracefulShutdownTest : public ::testing::TestWithParam<std::string> {};

// The flags `component` needs to start beyond the common ones: the router
// reads a model's config and tokenizer and names its workers (none answer
// here; it keeps trying them).
std::vector<std::string> ComponentFlags(const std::string& component) {
  if (component != "router") return {};
  const std::string model_dir = TestTmpPath("llama3-tiny");
  absl::StatusOr<model::generate::ModelSpec> spec = model::generate::PresetSpec("llama3-tiny");
  EXPECT_THAT(spec.status(), IsOk());
  if (spec.ok()) {
    EXPECT_THAT(model::generate::WriteModel(*spec, model_dir), IsOk());
  }
  return {absl::StrCat("--model=", model_dir), "--prefill_workers=127.0.0.1:1",
          "--decode_workers=127.0.0.1:1"};
}

TEST_P(GracefulShutdownTest, DrainsAndExitsZeroWithinFiveSeconds) {
  const std::string component = GetParam();
  const std::string log = TestTmpPath(component + ".log");
  std::vector<std::string> argv = {
      RunfilePath(absl::StrCat("services/", component, "/", component)), "--host=127.0.0.1",
      "--port=0", "--metrics_port=0", "--drain_timeout=3s"};
  for (std::string& flag : ComponentFlags(component)) argv.push_back(std::move(flag));
  absl::StatusOr<SpawnedProcess> spawned =
      Spawn({.argv = argv, .log_path = log, .wait_for_ready_line = true});
  ASSERT_THAT(spawned, IsOk());
  const nlohmann::json ready = nlohmann::json::parse(spawned->ready_line);
  const std::string address = absl::StrCat("127.0.0.1:", ready["grpc_port"].get<int>());
  EXPECT_EQ(ready["component"], component);
  EXPECT_EQ(ready["pid"].get<int>(), spawned->pid);

  // A streaming call in flight: Watch sends the current status, then every
  // change, until the server ends it.
  auto stub = Health::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext watch_context;
  watch_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  HealthCheckRequest request;
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> watch =
      stub->Watch(&watch_context, request);
  HealthCheckResponse first;
  ASSERT_TRUE(watch->Read(&first));
  EXPECT_EQ(first.status(), HealthCheckResponse::SERVING);

  // The watcher follows the stream to its end, as a client does, and closes
  // its side of the call.
  std::vector<HealthCheckResponse::ServingStatus> seen;
  grpc::Status watch_status;
  std::thread watcher([&] {
    HealthCheckResponse response;
    while (watch->Read(&response)) seen.push_back(response.status());
    watch_status = watch->Finish();
  });

  const absl::Time signalled = absl::Now();
  ASSERT_EQ(kill(spawned->pid, SIGTERM), 0);
  absl::StatusOr<ExitInfo> exit = WaitForExit(spawned->pid, absl::Seconds(5));
  const absl::Duration took = absl::Now() - signalled;
  ASSERT_THAT(exit, IsOk()) << TailOfFile(log);
  EXPECT_EQ(exit->exit_code, 0) << TailOfFile(log);
  EXPECT_EQ(exit->signal, 0);
  EXPECT_LT(took, absl::Seconds(5));
  std::printf("%s drained and exited 0 in %s\n", component.c_str(),
              absl::FormatDuration(took).c_str());

  // The watch was told NOT_SERVING and then ended cleanly by the drain.
  watcher.join();
  EXPECT_THAT(seen, ::testing::ElementsAre(HealthCheckResponse::NOT_SERVING));
  EXPECT_TRUE(watch_status.ok()) << watch_status.error_message();
}

INSTANTIATE_TEST_SUITE_P(EveryService, GracefulShutdownTest,
                         ::testing::Values("router", "worker", "attention", "controller"));

}  // namespace
}  // namespace trident
