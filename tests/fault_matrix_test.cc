// The fault matrix: faults injected at named points of a real cluster on
// loopback (router, two prefill and two decode workers, KV over UCX), each
// in several runs of 8 concurrent streams (half greedy, half seeded
// sampling). Every stream of every run must end with exactly one
// completion and the tokens of an unfaulted run (nothing lost, repeated or
// changed), every surviving worker must get all its KV blocks back, and
// each fault must be seen to have happened (the process died of SIGKILL,
// was stopped, or the router counted the stall). The cluster's CPU
// attention service, whose KV block store the decode workers write their
// prompts' blocks through to, must hold no sequence and no reserved, pinned
// or borrowed store block afterwards. The table of faults, runs and
// outcomes is printed.
//
// Faults: SIGKILL and SIGSTOP of a decode worker mid-stream; its crash and
// its wedged engine at the decode.token fault point; a prefill worker's
// crash mid-prefill (prefill.compute) and mid-transfer (prefill.transfer),
// a prefill worker stopped (SIGSTOP) as the requests arrive, and the CPU
// attention service holding every sequence killed mid-stream. The router
// killed mid-stream and restarted: its clients' streams end UNAVAILABLE
// with no wrong or repeated token, every worker frees the KV of the cut
// requests, and the same requests sent again through the restarted router
// get the unfaulted run's tokens. The controller and Prometheus killed
// mid-stream, in `trident up`'s cluster (which has both): serving needs
// neither, and without Prometheus the controller reads its signals as
// unavailable and flips no worker.
// TRIDENT_FAULT_RUNS sets the runs per fault (default 2); TRIDENT_FAULT_ONLY
// runs only the faults whose names contain it.

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/process/subprocess.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster_logs.h"
#include "tests/testing/concurrent_streams.h"
#include "tests/testing/disaggregated_call.h"
#include "tests/testing/fixture_models.h"
#include "tests/testing/metrics_scrape.h"
#include "tests/testing/service_process.h"
#include "tools/cli/cluster.h"
#include "tools/cli/cluster_status.h"
#include "trident/v1/controller.pb.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::ServiceProcess;
using ::trident::testing::StreamRecord;
using ::trident::testing::TestTmpPath;

constexpr int kStreams = 8;
constexpr int kMaxTokens = 400;
constexpr int kTokensBeforeFault = 12;
// Waves of streams at most per run while an armed prefill fault waits for
// its worker's first request.
constexpr int kMaxWaves = 3;

enum class Signal { kNone, kKill, kStop };

struct FaultCase {
  std::string name;
  // What the fault hits: a worker ("p1", "d1"), "router", "attention",
  // "controller" or "prometheus".
  std::string target;
  // Armed on the target from its start (--fault_points).
  std::string fault_points;
  // Sent to the target once every stream is mid-way.
  Signal signal = Signal::kNone;
  // Tokens every stream has when the signal is sent (0: as the requests
  // start; -1: just before they start).
  int tokens_before = kTokensBeforeFault;

  bool hits_router() const { return target == "router"; }
  bool hits_control_plane() const { return target == "controller" || target == "prometheus"; }
};

// What one run of a fault produced.
struct RunOutcome {
  int streams = 0;
  int streams_ok = 0;
  int lost = 0;
  int duplicated = 0;
  int mismatched = 0;
  int migrated = 0;
  bool kv_free = true;
  // The attention service holds no sequence, and its store no reserved,
  // pinned or borrowed block (AttentionServiceIdle).
  bool store_clean = true;
  // Blocks the decode workers wrote through to that store.
  int64_t store_written = 0;
  bool confirmed = false;
};

int RunsPerFault() {
  int runs = 2;
  if (const char* env = std::getenv("TRIDENT_FAULT_RUNS"); env != nullptr) {
    if (!absl::SimpleAtoi(env, &runs) || runs < 1) runs = 2;
  }
  return runs;
}

// The state letter of /proc/<pid>/stat ('T' when stopped).
char ProcessState(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() ? '?' : line[paren + 2];
}

// Reaps `pid` if it has exited (waiting up to `wait`); true when it died of
// SIGKILL.
bool DiedOfSigkill(pid_t pid, absl::Duration wait = absl::ZeroDuration()) {
  absl::StatusOr<ExitInfo> exit = WaitForExit(pid, wait);
  return exit.ok() && exit->signal == SIGKILL;
}

// Where a process of the cluster logs: kept with the test's outputs.
std::string LogPath(const std::string& name) {
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  return outputs == nullptr ? TestTmpPath(name) : absl::StrCat(outputs, "/", name);
}

// A worker's KV blocks as its next load sample has them.
std::string KvSummary(const ServiceProcess& worker) {
  const std::optional<v1::WorkerLoad> load = testing::NextLoadSample(worker.channel);
  if (!load.has_value()) return "no load sample";
  return absl::StrCat(load->kv_blocks_free(), " of ", load->kv_blocks_total(), " free, ",
                      load->kv_blocks_reserved(), " reserved, ", load->running_sequences(),
                      " running");
}

class Cluster {
 public:
  Cluster(const std::string& model_dir, const std::string& tag, const FaultCase* fault)
      : model_dir_(model_dir), tag_(tag), fault_(fault) {}

  absl::Status Start() {
    // The decode workers write their prompts' KV blocks through to the
    // attention service's store; for its own fault they place every
    // sequence there too.
    absl::StatusOr<ServiceProcess> attention = testing::StartService(
        {RunfilePath("services/attention/attention"), "--ucx_transports=tcp", "--kv_budget_mb=16",
         "--kv_store_mb=8", "--reconnect_grace=1s", "--threads=1", "--spin_window=0s"},
        LogPath(absl::StrCat(tag_, "-attention.log")));
    if (!attention.ok()) return attention.status();
    workers_["attention"] = *attention;
    std::vector<std::string> offload = {absl::StrCat("--attention_services=", attention->address),
                                        "--attention_timeout=3s"};
    if (fault_ != nullptr && fault_->target == "attention") {
      offload.push_back("--offload_min_context_tokens=1");
    }
    for (auto [name, role] : {std::pair{"p1", "prefill"}, std::pair{"p2", "prefill"},
                              std::pair{"d1", "decode"}, std::pair{"d2", "decode"}}) {
      std::vector<std::string> argv = testing::SmallCpuWorkerArgv(
          RunfilePath("services/worker/worker"), model_dir_, role, name);
      argv.push_back("--kv_transport=ucx");
      argv.push_back("--ucx_transports=tcp");
      if (std::string(role) == "decode") argv.insert(argv.end(), offload.begin(), offload.end());
      if (fault_ != nullptr && fault_->target == name && !fault_->fault_points.empty()) {
        argv.push_back(absl::StrCat("--fault_points=", fault_->fault_points));
      }
      absl::StatusOr<ServiceProcess> p =
          testing::StartService(argv, LogPath(absl::StrCat(tag_, "-", name, ".log")));
      if (!p.ok()) return p.status();
      workers_[name] = *p;
    }
    return StartRouter();
  }

  // (Re)starts the router in front of the workers.
  absl::Status StartRouter() {
    absl::StatusOr<ServiceProcess> router = testing::StartService(
        {RunfilePath("services/router/router"), absl::StrCat("--model=", model_dir_),
         absl::StrCat("--prefill_workers=", workers_["p1"].address, ",", workers_["p2"].address),
         absl::StrCat("--decode_workers=", workers_["d1"].address, ",", workers_["d2"].address),
         "--load_interval_ms=20", "--admission=false", "--keepalive_ms=1000",
         "--stall_timeout_ms=1500",
         // A reservation whose writer died (mid-transfer) is freed when its
         // lease ends: the writer might still be writing otherwise.
         "--kv_lease_ms=3000",
         // A prefill fault fires on the first request its worker gets.
         // Without learned overheads and prefix affinity (each fitted or
         // cached during warm-up, on a loaded machine possibly all for the
         // other worker), the router spreads the run's requests over both.
         absl::StrCat("--admission_learn_ttft_overhead=", !HitsPrefillWorker()),
         absl::StrCat("--kv_aware_routing=", !HitsPrefillWorker())},
        LogPath(absl::StrCat(tag_, "-router", ++router_starts_, ".log")));
    if (!router.ok()) return router.status();
    router_ = *router;
    const grpc::Status serving = testing::AwaitRouterServing(router_);
    if (!serving.ok()) return absl::UnavailableError(serving.error_message());
    return absl::OkStatus();
  }

  // Stops what is left (a stopped or wedged process is killed).
  void Stop() {
    if (router_.pid > 0) testing::StopService(router_).IgnoreError();
    for (auto& [name, p] : workers_) {
      if (p.pid <= 0) continue;
      if (ProcessState(p.pid) == 'T' || hung_.contains(name)) {
        kill(p.pid, SIGKILL);
        WaitForExit(p.pid, absl::Seconds(30)).IgnoreError();
        p.pid = -1;
        continue;
      }
      testing::StopService(p).IgnoreError();
    }
  }

  std::vector<StreamRecord> Run(const std::function<void()>& mid_way,
                                int tokens_before = kTokensBeforeFault) {
    return testing::RunConcurrentStreams(router_, kStreams, kMaxTokens, tokens_before, mid_way);
  }

  // Short streams, so that the faulted run finds every connection made:
  // through the router, and from each prefill worker to each decode worker
  // directly (the router's choices need not cover every pair). A prefill
  // worker that dies while it is still connecting to a decode worker can
  // take that worker down with it: Debian's UCX 1.13 asserts on the wire-up
  // reply it then purges (openucx/ucx#8175, fixed in 1.14).
  // The router's streams go last, so that its view of every worker's load
  // is fresh and idle when the faulted run starts.
  void WarmUp() {
    for (const char* p : {"p1", "p2"}) {
      for (const char* d : {"d1", "d2"}) {
        testing::DisaggregatedContexts contexts;
        const testing::DisaggregatedResult r =
            testing::GenerateDisaggregated(workers_[p], workers_[d], absl::StrCat("warm-", p, d),
                                           {1, 2, 3, 4, 5}, /*max_tokens=*/2, &contexts);
        EXPECT_TRUE(r.ok()) << "warming " << p << " to " << d
                            << " up: " << r.reserve_status.error_message() << " / "
                            << r.prefill_status.error_message() << " / "
                            << r.decode_status.error_message();
      }
    }
    // Prompts the runs do not use: no prefill worker then holds a run's
    // prefix, and the router places a run's requests as it would cold.
    testing::RunConcurrentStreams(
        router_, kStreams, /*max_tokens=*/4, /*tokens_before=*/0, [] {},
        /*first=*/kStreams);
  }

  bool HitsPrefillWorker() const {
    return fault_ != nullptr && (fault_->target == "p1" || fault_->target == "p2");
  }

  ServiceProcess& worker(const std::string& name) { return workers_[name]; }
  ServiceProcess& router() { return router_; }
  void MarkHung(const std::string& name) { hung_.insert(name); }

 private:
  const std::string model_dir_;
  const std::string tag_;
  const FaultCase* const fault_;
  std::map<std::string, ServiceProcess> workers_;
  std::set<std::string> hung_;
  ServiceProcess router_;
  int router_starts_ = 0;
};

class FaultMatrixTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = TestTmpPath("llama3-tiny");
    ASSERT_THAT(testing::EnsureFixtureModel("llama3-tiny", model_dir_), IsOk());
  }

  // Checks each stream against the reference and counts the outcome.
  static void CheckStreams(const std::vector<StreamRecord>& streams,
                           const std::vector<StreamRecord>& reference, const FaultCase& fault,
                           int run, RunOutcome& out) {
    for (int i = 0; i < kStreams; ++i) {
      const testing::StreamCheck c = testing::CheckStream(streams[i], reference[i]);
      ++out.streams;
      out.streams_ok += c.ok() ? 1 : 0;
      out.lost += c.lost;
      out.duplicated += c.duplicated;
      out.mismatched += c.mismatched;
      EXPECT_TRUE(c.ok()) << fault.name << " run " << run << " stream " << i << ": status "
                          << streams[i].status.error_message() << ", completions "
                          << streams[i].completions << ", lost " << c.lost << ", duplicated "
                          << c.duplicated << ", mismatched " << c.mismatched;
    }
  }

  // One faulted run, checked against `reference`.
  RunOutcome RunFault(const FaultCase& fault, int run, const std::vector<StreamRecord>& reference) {
    if (fault.hits_control_plane()) return RunControlPlaneFault(fault, run, reference);
    RunOutcome out;
    Cluster cluster(model_dir_, absl::StrCat("fault", &fault - kCases, "-run", run), &fault);
    absl::Status started = cluster.Start();
    EXPECT_THAT(started, IsOk()) << fault.name;
    if (!started.ok()) return out;
    if (fault.hits_router()) return RunRouterFault(cluster, fault, run, reference);
    ServiceProcess& target = cluster.worker(fault.target);
    const pid_t pid = target.pid;
    // A warmed-up cluster (every UCX connection made), then the fault.
    cluster.WarmUp();
    if (!fault.fault_points.empty()) kill(pid, SIGUSR2);
    bool stopped_seen = false;
    const auto mid_way = [&] {
      if (fault.signal == Signal::kKill) {
        kill(pid, SIGKILL);
      } else if (fault.signal == Signal::kStop) {
        kill(pid, SIGSTOP);
        // The fault is in place once the kernel says so.
        for (int i = 0; i < 100000 && ProcessState(pid) != 'T'; ++i) {
        }
        stopped_seen = ProcessState(pid) == 'T';
      }
    };
    CheckStreams(cluster.Run(mid_way, fault.tokens_before), reference, fault, run, out);
    // A fault point armed on a prefill worker fires only when the router
    // sends it a request: while it has not (the worker still runs), the run
    // goes on with another wave of streams, each checked alike.
    absl::StatusOr<ExitInfo> exit = absl::UnknownError("not waited for");
    const bool waits_for_request = cluster.HitsPrefillWorker() && !fault.fault_points.empty();
    for (int wave = 1;
         waits_for_request && !(exit = WaitForExit(pid, absl::Seconds(1))).ok() && wave < kMaxWaves;
         ++wave) {
      std::printf("%s run %d: %s got no request in wave %d; another wave\n", fault.name.c_str(),
                  run, fault.target.c_str(), wave);
      CheckStreams(cluster.Run(mid_way, fault.tokens_before), reference, fault, run, out);
    }
    const std::string metrics = testing::Scrape(cluster.router());
    out.migrated = static_cast<int>(
        testing::ValueOf(metrics, "trident_router_migrations_total{outcome=\"resumed\"}")
            .value_or(0));
    // Did the fault happen?
    if (fault.signal == Signal::kStop) {
      out.confirmed = stopped_seen;
    } else if (fault.fault_points.find("hang") != std::string::npos) {
      out.confirmed =
          testing::ValueOf(metrics, "trident_router_worker_stalls_total").value_or(0) > 0;
      cluster.MarkHung(fault.target);
    } else {
      out.confirmed = exit.ok() ? exit->signal == SIGKILL : DiedOfSigkill(pid);
      if (out.confirmed) target.pid = -1;
    }
    // Every surviving, working worker has its KV back.
    for (const std::string name : {"p1", "p2", "d1", "d2"}) {
      if (name == fault.target) continue;  // The attention service is no worker.
      const bool free = testing::AllKvBlocksFree(cluster.worker(name).channel);
      EXPECT_TRUE(free) << fault.name << " run " << run << ": " << name
                        << " holds KV: " << KvSummary(cluster.worker(name));
      out.kv_free = out.kv_free && free;
    }
    if (fault.target != "attention") {
      out.store_clean = ExpectAttentionIdle(cluster.worker("attention"), fault, run, out);
    }
    cluster.Stop();
    return out;
  }

  static bool ExpectAttentionIdle(const ServiceProcess& service, const FaultCase& fault, int run,
                                  RunOutcome& out) {
    const absl::StatusOr<v1::AttentionStats> idle = testing::AttentionServiceIdle(service.channel);
    EXPECT_THAT(idle, IsOk()) << fault.name << " run " << run;
    if (!idle.ok()) return false;
    out.store_written = idle->block_store().blocks_written_total();
    return true;
  }

  // The controller or Prometheus killed mid-stream in `trident up`'s
  // cluster: the controller, Prometheus scraping every service, the
  // attention service and its store, two prefill and two decode workers
  // registered with the controller, and the router following its topology.
  // Serving needs neither: every stream gets the reference's tokens with
  // nothing migrated. Without Prometheus the controller must read its
  // signals as unavailable (confirmed from its decisions) and flip nothing.
  RunOutcome RunControlPlaneFault(const FaultCase& fault, int run,
                                  const std::vector<StreamRecord>& reference) {
    RunOutcome out;
    cli::ClusterOptions options;
    options.state_dir = LogPath(absl::StrCat("fault", &fault - kCases, "-run", run));
    options.model_dir = model_dir_;
    options.worker_roles = {"prefill", "prefill", "decode", "decode"};
    options.worker_flags = {"--pin_threads=false", "--cpu_threads=1", "--kv_cache_mb=16",
                            "--ucx_transports=tcp"};
    options.offload_min_context_tokens = 0;
    options.attention_kv_budget_mb = 16;
    options.attention_kv_store_mb = 8;
    options.scrape_interval = absl::Milliseconds(200);
    options.drain_timeout = absl::Seconds(5);
    // Test-sized intervals, and targets no request comes near: a flip would
    // be the fault's doing.
    options.controller_flags = {
        "--decision_interval=500ms",  "--window_intervals=4",   "--min_samples=2",
        "--rate_window=2s",           "--ttft_slo=60s",         "--tpot_slo=60s",
        "--heartbeat_interval=200ms", "--prometheus_timeout=1s"};
    absl::StatusOr<cli::ClusterState> state = cli::Up(options);
    EXPECT_THAT(state, IsOk()) << fault.name;
    if (!state.ok()) return out;
    const cli::ProcessRecord* router_record = state->Find("router");
    ServiceProcess router{
        .pid = router_record->pid,
        .address = state->RouterAddress(),
        .channel = grpc::CreateChannel(state->RouterAddress(), grpc::InsecureChannelCredentials()),
        .metrics_port = router_record->metrics_port};
    const std::string controller = state->Find("controller")->GrpcAddress(state->host);
    const pid_t pid = state->Find(fault.target)->pid;
    testing::RunConcurrentStreams(router, kStreams, /*max_tokens=*/4, /*tokens_before=*/0, [] {});
    const std::vector<StreamRecord> streams = testing::RunConcurrentStreams(
        router, kStreams, kMaxTokens, kTokensBeforeFault, [&] { kill(pid, SIGKILL); });
    CheckStreams(streams, reference, fault, run, out);
    out.confirmed = DiedOfSigkill(pid, absl::Seconds(10));
    if (fault.target == "prometheus") {
      const bool noticed = ControllerSawMetricsUnavailable(controller);
      EXPECT_TRUE(noticed) << fault.name << " run " << run;
      out.confirmed = out.confirmed && noticed;
    }
    for (const cli::ProcessRecord& p : state->processes) {
      if (p.component != "worker") continue;
      auto channel =
          grpc::CreateChannel(p.GrpcAddress(state->host), grpc::InsecureChannelCredentials());
      const bool free = testing::AllKvBlocksFree(channel);
      EXPECT_TRUE(free) << fault.name << " run " << run << ": " << p.name << " holds KV";
      out.kv_free = out.kv_free && free;
    }
    out.store_clean =
        ExpectAttentionIdle(ServiceProcess{.channel = grpc::CreateChannel(
                                               state->Find("attention-0")->GrpcAddress(state->host),
                                               grpc::InsecureChannelCredentials())},
                            fault, run, out);
    if (::testing::Test::HasFailure()) testing::KeepClusterLogs(options.state_dir);
    EXPECT_THAT(cli::Down(options.state_dir), IsOk()) << fault.name;
    return out;
  }

  // Whether the controller, Prometheus gone, decides on unreadable signals
  // within 30 s and has flipped no worker.
  static bool ControllerSawMetricsUnavailable(const std::string& controller) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      absl::StatusOr<cli::ControllerView> view = cli::ReadController(controller, 1);
      if (view.ok() && view->status.decisions_size() > 0) {
        const std::string& reason = view->status.decisions(0).reason();
        if (reason == "metrics_unavailable" || reason == "metrics_error") {
          EXPECT_EQ(view->status.flips_total(), 0) << view->status.DebugString();
          return view->status.flips_total() == 0;
        }
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
    return false;
  }

  // The router killed mid-stream, then restarted. Its clients' streams end
  // with one terminal state (UNAVAILABLE, no completion) after a prefix of
  // the reference (no token wrong or repeated); every worker frees the KV
  // of the cut requests; the same requests through the restarted router
  // get exactly the reference's tokens (counted in the table).
  RunOutcome RunRouterFault(Cluster& cluster, const FaultCase& fault, int run,
                            const std::vector<StreamRecord>& reference) {
    RunOutcome out;
    cluster.WarmUp();
    const pid_t pid = cluster.router().pid;
    const std::vector<StreamRecord> cut = cluster.Run([&] { kill(pid, SIGKILL); });
    for (int i = 0; i < kStreams; ++i) {
      const testing::StreamCheck c = testing::CheckStream(cut[i], reference[i]);
      const bool clean_end =
          cut[i].status.error_code() == grpc::StatusCode::UNAVAILABLE && cut[i].completions == 0;
      EXPECT_TRUE(clean_end) << fault.name << " run " << run << " stream " << i << ": status "
                             << cut[i].status.error_message() << ", completions "
                             << cut[i].completions;
      EXPECT_EQ(c.duplicated + c.mismatched, 0) << fault.name << " run " << run << " stream " << i;
      out.duplicated += c.duplicated;
      out.mismatched += c.mismatched;
    }
    // Its clients see the connection close before the kernel has made it a
    // zombie: wait for the exit.
    out.confirmed = DiedOfSigkill(pid, absl::Seconds(10));
    if (out.confirmed) cluster.router().pid = -1;
    for (const std::string name : {"p1", "p2", "d1", "d2"}) {
      const bool free = testing::AllKvBlocksFree(cluster.worker(name).channel);
      EXPECT_TRUE(free) << fault.name << " run " << run << ": " << name
                        << " holds KV: " << KvSummary(cluster.worker(name));
      out.kv_free = out.kv_free && free;
    }
    out.store_clean = ExpectAttentionIdle(cluster.worker("attention"), fault, run, out);
    const absl::Status restarted = cluster.StartRouter();
    EXPECT_THAT(restarted, IsOk()) << fault.name;
    if (restarted.ok()) {
      SCOPED_TRACE("after the restart");
      CheckStreams(cluster.Run([] {}), reference, fault, run, out);
    }
    cluster.Stop();
    return out;
  }

  static const FaultCase kCases[];
  std::string model_dir_;
};

const FaultCase FaultMatrixTest::kCases[] = {
    {"decode SIGKILL mid-stream", "d1", "", Signal::kKill},
    {"decode SIGSTOP mid-stream", "d1", "", Signal::kStop},
    {"decode crash at decode.token", "d1", "decode.token=crash@30~", Signal::kNone},
    {"decode wedged at decode.token", "d1", "decode.token=hang@30~", Signal::kNone},
    {"prefill crash mid-prefill", "p1", "prefill.compute=crash~", Signal::kNone},
    {"prefill crash mid-transfer", "p1", "prefill.transfer=crash~", Signal::kNone},
    // Stopped just before the requests come: those the router sends it
    // (it still looks idle) are in its hands. A stop racing their arrival
    // could find its prefills done and nothing left to migrate.
    {"prefill SIGSTOP as requests come", "p1", "", Signal::kStop, /*tokens_before=*/-1},
    {"router SIGKILL, restarted", "router", "", Signal::kKill},
    // Every sequence's KV and attention at the service, which is killed:
    // the decode workers end its sequences UNAVAILABLE and the router
    // migrates them (or, where one fits, its worker recomputes it).
    {"attention service SIGKILL mid-step", "attention", "", Signal::kKill},
    {"controller SIGKILL mid-stream", "controller", "", Signal::kKill},
    {"Prometheus SIGKILL mid-stream", "prometheus", "", Signal::kKill},
};

TEST_F(FaultMatrixTest, NoStreamLosesOrRepeatsATokenUnderAnyFault) {
  // The unfaulted reference.
  Cluster clean(model_dir_, "reference", nullptr);
  ASSERT_THAT(clean.Start(), IsOk());
  const std::vector<StreamRecord> reference = clean.Run([] {});
  clean.Stop();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(reference[i].status.ok()) << i << ": " << reference[i].status.error_message();
    ASSERT_EQ(reference[i].tokens.size(), static_cast<size_t>(kMaxTokens));
  }

  const int runs = RunsPerFault();
  std::string table = absl::StrFormat("%-36s %4s %8s %8s %5s %5s %8s %8s %8s %7s %9s\n", "fault",
                                      "runs", "streams", "migrated", "lost", "dup", "changed",
                                      "kv_free", "store_ok", "stored", "confirmed");
  const char* only = std::getenv("TRIDENT_FAULT_ONLY");
  for (const FaultCase& fault : kCases) {
    if (only != nullptr && fault.name.find(only) == std::string::npos) continue;
    RunOutcome total;
    int confirmed = 0;
    int kv_free = 0;
    int store_clean = 0;
    for (int run = 0; run < runs; ++run) {
      const RunOutcome out = RunFault(fault, run, reference);
      total.streams += out.streams;
      total.streams_ok += out.streams_ok;
      total.lost += out.lost;
      total.duplicated += out.duplicated;
      total.mismatched += out.mismatched;
      total.migrated += out.migrated;
      confirmed += out.confirmed ? 1 : 0;
      kv_free += out.kv_free ? 1 : 0;
      store_clean += out.store_clean ? 1 : 0;
      total.store_written += out.store_written;
      EXPECT_TRUE(out.confirmed) << fault.name << " run " << run << ": the fault did not happen";
      EXPECT_TRUE(out.kv_free) << fault.name << " run " << run << ": KV blocks leaked";
      // A lost attention service's sequences are recomputed where they are.
      // The store check means something only where prompts reached it.
      if (fault.target != "attention") {
        EXPECT_GT(out.store_written, 0) << fault.name << " run " << run << ": nothing stored";
      }
      if (!fault.hits_router() && !fault.hits_control_plane() && fault.target != "attention") {
        EXPECT_GT(out.migrated, 0) << fault.name << " run " << run << ": nothing migrated";
      }
    }
    // The attention service's own fault leaves no store to check.
    const bool has_store = fault.target != "attention";
    table += absl::StrFormat("%-36s %4d %4d/%-3d %8d %5d %5d %8d %5d/%-3d %8s %7s %5d/%-3d\n",
                             fault.name, runs, total.streams_ok, total.streams, total.migrated,
                             total.lost, total.duplicated, total.mismatched, kv_free, runs,
                             has_store ? absl::StrCat(store_clean, "/", runs) : "-",
                             has_store ? absl::StrCat(total.store_written) : "-", confirmed, runs);
  }
  std::printf("%s", table.c_str());
}

}  // namespace
}  // namespace trident
