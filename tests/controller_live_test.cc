// The controller live, end to end (CPU backend): `trident up`'s cluster with
// three workers (prefill, prefill, decode), the attention service, the
// router, a real Prometheus and the controller, whose policy runs on
// test-sized intervals. Load comes through the router from client threads.
//
//   1. Prompt-heavy traffic (one output token: no TPOT): the controller
//      decides on real signals and flips nothing.
//   2. The controller is killed: the router keeps serving every request with
//      the last topology. It is restarted on its address: the members
//      register again with the new incarnation, and over further intervals
//      of the same traffic it flips nothing.
//   3. Generation-heavy traffic (short prompts, long outputs) against a
//      test-sized TPOT target: decode pressure; the controller flips one
//      prefill worker to decode through WorkerControl.SetRole, and the router
//      sends decode work to it.
//
// Throughout, every request is answered with all its tokens (none lost, none
// repeated), and at the end every worker's KV blocks and the attention
// service's sequences are all released. The flips and their timeline are
// printed. Waits poll for conditions with deadlines sized for a loaded
// 2-core machine; nothing asserts on wall-clock figures.

#include <signal.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/process/subprocess.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "common/time/proto_time.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster_logs.h"
#include "tests/testing/router_load.h"
#include "tests/testing/service_process.h"
#include "tools/cli/cluster.h"
#include "tools/cli/cluster_status.h"
#include "tools/cli/generate.h"
#include "trident/v1/attention.grpc.pb.h"
#include "trident/v1/controller.pb.h"

namespace trident {
namespace {

namespace v1 = ::trident::v1;
using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::TestTmpPath;

constexpr absl::Duration kPhaseDeadline = absl::Minutes(3);

using testing::GenerationOutcome;
using testing::RouterLoad;

// Client threads sending one greedy prompt through the router until stopped.
std::unique_ptr<RouterLoad> Mix(const std::string& router, const std::string& prompt,
                                int32_t max_tokens, int clients) {
  return std::make_unique<RouterLoad>(router, clients, [prompt, max_tokens](int, int) {
    return cli::GenerateOptions{.prompt = prompt,
                                .max_tokens = max_tokens,
                                .ignore_eos = true,
                                .timeout = absl::Minutes(2)};
  });
}

// Every request answered OK with exactly its tokens; the texts of one mix
// (greedy, one prompt) printed with how many agree with the most common.
void ExpectAllAnswered(const std::vector<GenerationOutcome>& outcomes, const std::string& phase) {
  ASSERT_FALSE(outcomes.empty()) << phase << ": no request was sent";
  std::map<std::string, int> texts;
  for (const GenerationOutcome& o : outcomes) {
    EXPECT_TRUE(o.ok) << phase << ": " << o.error;
    if (!o.ok) continue;
    EXPECT_EQ(o.tokens, o.max_tokens) << phase << ": tokens lost or repeated";
    EXPECT_EQ(o.usage_tokens, o.max_tokens) << phase;
    ++texts[o.text];
  }
  int most = 0;
  for (const auto& [text, count] : texts) most = std::max(most, count);
  std::printf("%s: %zu requests answered, %d of them with the most common text\n", phase.c_str(),
              outcomes.size(), most);
}

// Polls until `done` holds or the deadline passes.
template <typename Predicate>
bool Eventually(Predicate done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(50);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
  return true;
}

// The controller's status and topology, as `trident status` reads them.
class ControllerClient {
 public:
  explicit ControllerClient(std::string address) : address_(std::move(address)) {}

  absl::StatusOr<v1::ControllerStatus> Status(int max_decisions = 1000) {
    absl::StatusOr<cli::ControllerView> view = cli::ReadController(address_, max_decisions);
    if (!view.ok()) return view.status();
    return std::move(view->status);
  }

  absl::StatusOr<v1::Topology> Topology() {
    absl::StatusOr<cli::ControllerView> view = cli::ReadController(address_, 1);
    if (!view.ok()) return view.status();
    return std::move(view->topology);
  }

  // Waits until the controller has made `count` decisions on real signals
  // (any reason but the ones that say the signals were unreadable, or that
  // the policy is still gathering them). Returns them, newest first.
  absl::StatusOr<v1::ControllerStatus> AwaitInformedDecisions(int count, absl::Duration timeout) {
    absl::StatusOr<v1::ControllerStatus> status;
    const bool informed = Eventually(
        [&] {
          status = Status();
          if (!status.ok()) return false;
          int n = 0;
          for (const v1::RoleDecision& d : status->decisions()) {
            n += d.reason() != "metrics_unavailable" && d.reason() != "series_missing" &&
                 d.reason() != "metrics_error" && d.reason() != "warming_up";
          }
          return n >= count;
        },
        timeout);
    if (informed) return status;
    return absl::DeadlineExceededError(absl::StrCat(
        "fewer than ", count, " informed decisions; last status: ",
        status.ok() ? status->DebugString() : status.status().ToString()));
  }

 private:
  const std::string address_;
};

bool AllMembersServing(ControllerClient& controller, uint64_t incarnation) {
  absl::StatusOr<v1::Topology> topology = controller.Topology();
  if (!topology.ok() || topology->controller_incarnation() != incarnation) return false;
  if (topology->workers_size() != 3 || topology->attention_services_size() != 1) return false;
  for (const v1::WorkerEntry& w : topology->workers()) {
    if (w.state() != v1::SERVING_STATE_SERVING) return false;
  }
  return topology->attention_services(0).state() == v1::SERVING_STATE_SERVING;
}

bool AttentionEmpty(const std::string& address, absl::Duration timeout) {
  auto stub =
      v1::Attention::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  return Eventually(
      [&] {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
        v1::AttentionStats stats;
        return stub->GetStats(&context, v1::GetAttentionStatsRequest(), &stats).ok() &&
               stats.sequences() == 0 && stats.held_bytes() == 0;
      },
      timeout);
}

void PrintTimeline(const v1::ControllerStatus& status, absl::Time start) {
  std::printf("controller incarnation %llu: %lld flip(s)\n",
              static_cast<unsigned long long>(status.controller_incarnation()),
              static_cast<long long>(status.flips_total()));
  for (int i = status.decisions_size() - 1; i >= 0; --i) {
    const v1::RoleDecision& d = status.decisions(i);
    const double t = absl::ToDoubleSeconds(TimeFromProto(d.time()) - start);
    if (d.flip() || i == 0) {
      std::printf("  t=%6.1fs %s %s: prefill %.2f decode %.2f: %s\n", t,
                  d.flip() ? "FLIP" : "hold", d.reason().c_str(), d.prefill().observed(),
                  d.decode().observed(), d.detail().c_str());
    }
  }
}

class ControllerLiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = TestTmpPath("cluster");
    cli::ClusterOptions options;
    options.state_dir = state_dir_;
    options.worker_roles = {"prefill", "prefill", "decode"};
    options.scrape_interval = absl::Milliseconds(500);
    options.drain_timeout = absl::Seconds(30);
    // Test-sized policy: 1 s intervals, a 4 s rate window (8 scrapes),
    // flips after 2 sustained intervals; a TTFT target no prompt comes
    // near, and a TPOT target every real decode step exceeds, so only the
    // generation-heavy mix reads as pressure.
    options.controller_flags = {
        "--decision_interval=1s", "--window_intervals=4",  "--min_samples=2",
        "--sustain_intervals=2",  "--min_dwell=2s",        "--rate_window=4s",
        "--ttft_slo=60s",         "--tpot_slo=100us",      "--heartbeat_interval=200ms",
        "--dead_after=2s",        "--flip_drain_timeout=60s"};
    absl::StatusOr<cli::ClusterState> state = cli::Up(options);
    ASSERT_THAT(state, IsOk());
    state_ = *state;
    start_ = absl::Now();
  }

  void TearDown() override {
    if (HasFailure()) testing::KeepClusterLogs(state_dir_);
    (void)cli::Down(state_dir_);
  }

  std::string Address(const std::string& name) {
    return state_.Find(name)->GrpcAddress(state_.host);
  }

  std::string state_dir_;
  cli::ClusterState state_;
  absl::Time start_;
};

TEST_F(ControllerLiveTest, ShiftFlipsAWorkerRestartFlipsNone) {
  ControllerClient controller(Address("controller"));
  ASSERT_TRUE(Eventually([&] { return controller.Topology().ok(); }, absl::Seconds(30)));
  const uint64_t first_incarnation = controller.Topology()->controller_incarnation();
  ASSERT_TRUE(Eventually([&] { return AllMembersServing(controller, first_incarnation); },
                         absl::Seconds(60)))
      << controller.Topology()->DebugString();
  const std::string long_prompt =
      "In the beginning the cluster had prefill workers and decode workers, and the prompts "
      "were long while the answers were short, so the prefill workers were busy all day";

  // 1. Prompt-heavy: informed decisions, no flip.
  auto prompt_heavy = Mix(state_.RouterAddress(), long_prompt, 1, 3);
  absl::StatusOr<v1::ControllerStatus> status =
      controller.AwaitInformedDecisions(4, kPhaseDeadline);
  ASSERT_THAT(status, IsOk());
  EXPECT_EQ(status->flips_total(), 0) << status->DebugString();
  PrintTimeline(*status, start_);

  // 2. Killed mid-run: the router serves with the last topology.
  const pid_t controller_pid = state_.Find("controller")->pid;
  ASSERT_EQ(kill(controller_pid, SIGKILL), 0);
  ASSERT_THAT(WaitForExit(controller_pid, absl::Seconds(30)).status(), IsOk());
  const int64_t before = prompt_heavy->answered();
  ASSERT_TRUE(Eventually([&] { return prompt_heavy->answered() >= before + 6; }, kPhaseDeadline))
      << "the router stopped answering while the controller was down";
  std::printf("controller down: %lld requests answered meanwhile\n",
              static_cast<long long>(prompt_heavy->answered() - before));
  absl::StatusOr<cli::ProcessRecord> restarted = cli::RestartProcess(state_dir_, "controller");
  ASSERT_THAT(restarted, IsOk());
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<v1::Topology> t = controller.Topology();
        return t.ok() && t->controller_incarnation() != first_incarnation &&
               AllMembersServing(controller, t->controller_incarnation());
      },
      kPhaseDeadline))
      << "members did not register again with the restarted controller";
  status = controller.AwaitInformedDecisions(4, kPhaseDeadline);
  ASSERT_THAT(status, IsOk());
  EXPECT_EQ(status->flips_total(), 0) << "spurious flip after restart: " << status->DebugString();
  PrintTimeline(*status, start_);
  ExpectAllAnswered(prompt_heavy->Stop(), "prompt-heavy (controller killed and restarted)");

  // 3. Generation-heavy: decode pressure moves one prefill worker.
  const absl::Time shift = absl::Now();
  auto generation_heavy = Mix(state_.RouterAddress(), "Once", 48, 3);
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<v1::ControllerStatus> s = controller.Status(1);
        return s.ok() && s->flips_total() >= 1;
      },
      kPhaseDeadline))
      << "no flip under generation-heavy traffic: " << controller.Status(40)->DebugString();
  std::printf("flip %.1f s after the traffic shifted\n", absl::ToDoubleSeconds(absl::Now() - shift));
  status = controller.Status();
  ASSERT_THAT(status, IsOk());
  std::string flipped;
  for (const v1::RoleDecision& d : status->decisions()) {
    if (d.flip()) flipped = d.worker_id();
  }
  ASSERT_FALSE(flipped.empty());
  // The topology and the worker agree on its new role; the router uses it.
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<v1::Topology> t = controller.Topology();
        if (!t.ok()) return false;
        for (const v1::WorkerEntry& w : t->workers()) {
          if (w.registration().worker_id() == flipped) {
            return w.role() == v1::ROLE_DECODE && w.state() == v1::SERVING_STATE_SERVING;
          }
        }
        return false;
      },
      kPhaseDeadline));
  // The router sends decode work to the worker in its new role.
  const absl::Time flipped_at = absl::Now();
  auto decoded_on_flipped = [&] {
    return generation_heavy->Count([&](const GenerationOutcome& o) {
      return o.ok && o.finished > flipped_at && o.decode_worker == flipped;
    });
  };
  EXPECT_TRUE(Eventually([&] { return decoded_on_flipped() >= 3; }, kPhaseDeadline))
      << "no request decoded on " << flipped << " after its flip";
  std::printf("%lld requests decoded on %s after its flip\n",
              static_cast<long long>(decoded_on_flipped()),
              flipped.c_str());
  ExpectAllAnswered(generation_heavy->Stop(), "generation-heavy");
  status = controller.Status();
  ASSERT_THAT(status, IsOk());
  PrintTimeline(*status, start_);
  EXPECT_EQ(status->flips_total(), 1) << "one prefill worker is left: it is never taken";

  // Nothing leaked.
  const absl::StatusOr<cli::ClusterState> now = cli::LoadState(state_dir_);
  ASSERT_THAT(now, IsOk());
  for (const cli::ProcessRecord& p : now->processes) {
    if (p.component == "worker") {
      EXPECT_TRUE(testing::AllKvBlocksFree(
          grpc::CreateChannel(p.GrpcAddress(now->host), grpc::InsecureChannelCredentials()),
          absl::Seconds(60)))
          << p.name;
    }
    if (p.component == "attention") {
      EXPECT_TRUE(AttentionEmpty(p.GrpcAddress(now->host), absl::Seconds(60))) << p.name;
    }
  }
}

}  // namespace
}  // namespace trident
