// Migration through real processes on loopback: a prefill worker, a decode
// worker serving 8 streams (half greedy, half seeded sampling with
// penalties) and a spare worker, behind a router. The decode worker is
// killed with SIGKILL mid-stream; every stream continues on the spare
// (after the controller-like role change that makes it a decode worker)
// and ends with exactly the tokens of an unfaulted run: none lost, none
// repeated, one completion each. Every KV block comes back on the
// survivors, and the router counts 8 resumed migrations.

#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/process/subprocess.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/concurrent_streams.h"
#include "tests/testing/fixture_models.h"
#include "tests/testing/metrics_scrape.h"
#include "tests/testing/service_process.h"
#include "trident/v1/generation.grpc.pb.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::ServiceProcess;
using ::trident::testing::TestTmpPath;

constexpr int kStreams = 8;
// Long enough that every stream is mid-way when the worker dies (the tiny
// model makes a token in well under a millisecond per sequence).
constexpr int kMaxTokens = 600;
// Tokens every stream has before the kill.
constexpr int kTokensBeforeKill = 16;

class MigrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = TestTmpPath("llama3-tiny");
    ASSERT_THAT(testing::EnsureFixtureModel("llama3-tiny", model_dir_), IsOk());
    for (auto [role, name, process] :
         {std::tuple{"prefill", "p1", &prefill_}, std::tuple{"decode", "d1", &decode_},
          std::tuple{"prefill", "spare", &spare_}}) {
      auto started = testing::StartUcxWorker(model_dir_, role, name, {"--role_change_announce=0s"});
      ASSERT_THAT(started, IsOk());
      *process = *started;
    }
    auto router =
        testing::StartTestRouter(model_dir_, absl::StrCat(prefill_.address, ",", spare_.address),
                                 absl::StrCat(decode_.address, ",", spare_.address));
    ASSERT_THAT(router, IsOk());
    router_ = *router;
    const grpc::Status serving = testing::AwaitRouterServing(router_);
    ASSERT_TRUE(serving.ok()) << serving.error_message();
  }

  void TearDown() override {
    for (ServiceProcess* p : {&router_, &prefill_, &decode_, &spare_}) {
      EXPECT_THAT(testing::StopService(*p), IsOk());
    }
  }

  std::vector<testing::StreamRecord> RunStreams(const std::function<void()>& mid_way) {
    return testing::RunConcurrentStreams(router_, kStreams, kMaxTokens, kTokensBeforeKill,
                                         mid_way);
  }

  std::string model_dir_;
  ServiceProcess prefill_, decode_, spare_, router_;
};

TEST_F(MigrationTest, KillingTheDecodeWorkerMidStreamLosesNoToken) {
  // The unfaulted run: every stream on the decode worker.
  const std::vector<testing::StreamRecord> reference = RunStreams([] {});
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(reference[i].status.ok()) << i << ": " << reference[i].status.error_message();
    ASSERT_EQ(reference[i].tokens.size(), static_cast<size_t>(kMaxTokens)) << i;
    ASSERT_EQ(reference[i].complete.placement().decode_worker_id(), "d1") << i;
  }

  std::vector<size_t> tokens_at_kill;
  const pid_t killed = decode_.pid;
  const std::vector<testing::StreamRecord> faulted = RunStreams([&] {
    // The fault, and a check that it happened: the process is gone.
    ASSERT_EQ(kill(killed, SIGKILL), 0);
    absl::StatusOr<ExitInfo> exit = WaitForExit(killed, absl::Seconds(30));
    ASSERT_THAT(exit.status(), IsOk());
    ASSERT_EQ(exit->signal, SIGKILL);
    decode_.pid = -1;
    // A controller would now move the spare to decoding.
    auto control = v1::WorkerControl::NewStub(spare_.channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    v1::SetRoleRequest request;
    request.set_role(v1::ROLE_DECODE);
    request.set_reason("migration_test");
    v1::SetRoleResponse response;
    ASSERT_TRUE(control->SetRole(&context, request, &response).ok());
  });

  int migrated = 0;
  for (int i = 0; i < kStreams; ++i) {
    const testing::StreamRecord& s = faulted[i];
    ASSERT_TRUE(s.status.ok()) << i << ": " << s.status.error_message();
    EXPECT_EQ(s.completions, 1) << i;
    EXPECT_EQ(s.complete.finish_reason(), v1::FINISH_REASON_LENGTH) << i;
    EXPECT_EQ(s.complete.usage().completion_tokens(), kMaxTokens) << i;
    EXPECT_EQ(s.tokens, reference[i].tokens) << "stream " << i << (i % 2 ? " (seeded)" : " (greedy)");
    if (s.complete.placement().decode_worker_id() == "spare") ++migrated;
  }
  std::printf("%d of %d streams resumed on the spare after SIGKILL of the decode worker\n",
              migrated, kStreams);
  // Each stream was mid-way: it finished on the spare.
  EXPECT_EQ(migrated, kStreams);
  const std::string metrics = testing::ScrapeUntil(router_, [](const std::string& body) {
    return testing::ValueOf(body, "trident_router_migrations_total{outcome=\"resumed\"}") ==
           kStreams;
  });
  EXPECT_EQ(testing::ValueOf(metrics, "trident_router_migrations_total{outcome=\"resumed\"}"),
            kStreams);
  EXPECT_TRUE(testing::AllKvBlocksFree(prefill_));
  EXPECT_TRUE(testing::AllKvBlocksFree(spare_));
}

}  // namespace
}  // namespace trident
