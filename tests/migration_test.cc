// Migration through real processes on loopback: a prefill worker, a decode
// worker serving 8 streams (half greedy, half seeded sampling with
// penalties) and a spare worker, behind a router. The decode worker is
// killed with SIGKILL mid-stream; every stream continues on the spare
// (after the controller-like role change that makes it a decode worker)
// and ends with exactly the tokens of an unfaulted run: none lost, none
// repeated, one completion each. Every KV block comes back on the
// survivors, and the router counts 8 resumed migrations.

#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/process/subprocess.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
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

// One client stream's record: what it received, in order.
struct Stream {
  std::vector<int32_t> tokens;
  int completions = 0;
  v1::GenerateComplete complete;
  grpc::Status status;
  bool done = false;
};

class MigrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = TestTmpPath("llama3-tiny");
    ASSERT_THAT(testing::EnsureFixtureModel("llama3-tiny", model_dir_), IsOk());
    for (auto [role, name, process] :
         {std::tuple{"prefill", "p1", &prefill_}, std::tuple{"decode", "d1", &decode_},
          std::tuple{"prefill", "spare", &spare_}}) {
      auto started = testing::StartService(
          {RunfilePath("services/worker/worker"), absl::StrCat("--role=", role),
           absl::StrCat("--worker_id=", name), "--pin_threads=false", "--cpu_threads=1",
           "--kv_cache_mb=16", "--kv_transport=ucx", "--ucx_transports=tcp",
           "--role_change_announce=0s", absl::StrCat("--model=", model_dir_)},
          TestTmpPath(absl::StrCat(name, ".log")));
      ASSERT_THAT(started, IsOk());
      *process = *started;
    }
    auto router = testing::StartService(
        {RunfilePath("services/router/router"), absl::StrCat("--model=", model_dir_),
         absl::StrCat("--prefill_workers=", prefill_.address, ",", spare_.address),
         absl::StrCat("--decode_workers=", decode_.address, ",", spare_.address),
         "--load_interval_ms=20", "--admission=false"},
        TestTmpPath("router.log"));
    ASSERT_THAT(router, IsOk());
    router_ = *router;
    // Until the router has every worker's load it refuses requests at
    // once (RESOURCE_EXHAUSTED): one short generation that gets through.
    auto stub = v1::Generation::NewStub(router_.channel);
    v1::GenerateRequest probe = Request(0);
    probe.mutable_sampling()->set_max_tokens(1);
    grpc::Status status;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    do {
      grpc::ClientContext context;
      auto reader = stub->Generate(&context, probe);
      v1::GenerateResponse response;
      while (reader->Read(&response)) {
      }
      status = reader->Finish();
    } while (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && absl::Now() < deadline);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }

  void TearDown() override {
    for (ServiceProcess* p : {&router_, &prefill_, &decode_, &spare_}) {
      EXPECT_THAT(testing::StopService(*p), IsOk());
    }
  }

  // Stream i: greedy when even, else seeded sampling with penalties.
  static v1::GenerateRequest Request(int i) {
    v1::GenerateRequest request;
    for (int t = 0; t < 24 + 3 * i; ++t) request.mutable_token_ids()->add_ids((t * 31 + i) % 250);
    v1::SamplingParams& s = *request.mutable_sampling();
    s.set_max_tokens(kMaxTokens);
    if (i % 2 == 0) {
      s.set_temperature(0);
    } else {
      s.set_temperature(0.9f);
      s.set_top_k(40);
      s.set_seed(1000 + i);
      s.set_presence_penalty(0.4f);
      s.set_frequency_penalty(0.2f);
    }
    request.mutable_stop()->set_ignore_eos(true);
    return request;
  }

  // Runs the 8 streams at once on threads; `mid_way` runs once every
  // stream has kTokensBeforeKill tokens.
  std::vector<Stream> RunStreams(const std::function<void()>& mid_way) {
    std::vector<Stream> streams(kStreams);
    absl::Mutex mu;
    std::vector<std::thread> threads;
    auto stub = v1::Generation::NewStub(router_.channel);
    for (int i = 0; i < kStreams; ++i) {
      threads.emplace_back([&, i] {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
        auto reader = stub->Generate(&context, Request(i));
        v1::GenerateResponse response;
        while (reader->Read(&response)) {
          absl::MutexLock lock(&mu);
          if (response.has_chunk()) {
            for (int32_t t : response.chunk().token_ids()) streams[i].tokens.push_back(t);
          } else if (response.has_complete()) {
            ++streams[i].completions;
            streams[i].complete = response.complete();
          }
        }
        const grpc::Status status = reader->Finish();
        absl::MutexLock lock(&mu);
        streams[i].status = status;
        streams[i].done = true;
      });
    }
    {
      absl::MutexLock lock(&mu);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        for (const Stream& s : streams) {
          if (!s.done && static_cast<int>(s.tokens.size()) < kTokensBeforeKill) return false;
        }
        return true;
      };
      mu.Await(absl::Condition(&ready));
    }
    mid_way();
    for (std::thread& t : threads) t.join();
    return streams;
  }

  std::string model_dir_;
  ServiceProcess prefill_, decode_, spare_, router_;
};

TEST_F(MigrationTest, KillingTheDecodeWorkerMidStreamLosesNoToken) {
  // The unfaulted run: every stream on the decode worker.
  const std::vector<Stream> reference = RunStreams([] {});
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(reference[i].status.ok()) << i << ": " << reference[i].status.error_message();
    ASSERT_EQ(reference[i].tokens.size(), static_cast<size_t>(kMaxTokens)) << i;
    ASSERT_EQ(reference[i].complete.placement().decode_worker_id(), "d1") << i;
  }

  std::vector<size_t> tokens_at_kill;
  const pid_t killed = decode_.pid;
  const std::vector<Stream> faulted = RunStreams([&] {
    // The fault, and a check that it happened: the process is gone.
    ASSERT_EQ(kill(killed, SIGKILL), 0);
    int wstatus = 0;
    ASSERT_EQ(waitpid(killed, &wstatus, 0), killed);
    ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL);
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
    const Stream& s = faulted[i];
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
