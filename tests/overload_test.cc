// Overload through real processes: 2 prefill + 2 decode CPU workers behind a
// router, driven open loop by the load generator at twice the cluster's
// measured capacity. With SLO admission on, >= 95% of the accepted requests
// meet their TTFT and TPOT targets and rejections arrive within 50 ms; with
// admission off, the same schedule's SLO attainment collapses.
//
// Phases, in one test (each needs the one before):
//   1. Unloaded latencies: 16 requests at 2/s (which also warm the workers
//      up); their TTFT and TPOT medians times kTtftSloFactor and
//      kTpotSloFactor are the SLO targets. The factors leave room for the
//      batching and queueing a loaded cluster needs to be useful at all (4
//      CPU workers share 2 cores: a busy prefill slows every decode step).
//   2. Capacity: a burst of requests without targets, all sent at once; the
//      cluster's saturated throughput is their number over the time from
//      the burst to the last completion (the cluster is busy all along).
//      This is the raw throughput at saturation, above what the cluster can
//      serve within the targets, so twice it is a deep overload.
//   3. Overload, admission on: Poisson arrivals at kOverloadFactor times the
//      capacity, every request carrying the targets.
//   4. Overload, admission off: the router restarted with --admission=false,
//      the same workers, the same schedule (same seed).
// Every figure is printed; the router's debug log also holds, per request,
// the admission's predictions next to what happened, summarized here.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/loadgen/loadgen.h"
#include "bench/loadgen/runner.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/testing/runfiles.h"
#include "tests/testing/service_process.h"
#include "tools/make_model/model_gen.h"
#include "trident/v1/generation.grpc.pb.h"

namespace trident {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::ServiceProcess;
using ::trident::testing::TestTmpPath;

constexpr uint64_t kSeed = 20240611;
// SLO targets as multiples of the unloaded medians.
constexpr double kTtftSloFactor = 10;
constexpr double kTpotSloFactor = 8;
// Overload: arrivals at this multiple of the measured capacity.
constexpr double kOverloadFactor = 2;
constexpr absl::Duration kOverloadDuration = absl::Seconds(15);
constexpr int kBurstRequests = 40;

// A model large enough that the workers' compute, not the RPCs around it,
// is what saturates the CPU: llama3-tiny's layout at 512 hidden, 4 layers
// (12M parameters, ~5 ms per decode step on one core).
make_model::ModelSpec OverloadModelSpec() {
  make_model::ModelSpec spec = *make_model::PresetSpec("llama3-tiny");
  spec.preset = "llama3-small";
  spec.hidden_size = 512;
  spec.num_layers = 4;
  spec.num_heads = 8;
  spec.num_kv_heads = 4;
  spec.head_dim = 64;
  spec.intermediate_size = 1408;
  return spec;
}

// Prompts of 64 or 128 tokens (a batch of prefills then has few distinct
// sizes, which the CPU backend's per-shape kernels like), 16 to 64 outputs.
loadgen::WorkloadSpec Workload(double rate, absl::Duration duration, int64_t num_requests) {
  loadgen::WorkloadSpec w;
  w.seed = kSeed;
  w.arrival.kind = loadgen::ArrivalKind::kPoisson;
  w.arrival.rate_per_s = rate;
  w.duration = duration;
  w.num_requests = num_requests;
  w.prompt_tokens.kind = loadgen::LengthDistribution::Kind::kCsv;
  w.prompt_tokens.csv_path = "inline:prompts";
  w.prompt_tokens.csv_rows = {{64, 1}, {128, 1}};
  w.prompt_tokens.column = loadgen::LengthColumn::kPrompt;
  w.prompt_tokens.spec = "64 or 128";
  w.output_tokens.kind = loadgen::LengthDistribution::Kind::kUniform;
  w.output_tokens.min_tokens = 16;
  w.output_tokens.max_tokens = 64;
  w.output_tokens.spec = "uniform:16:64";
  w.qos.push_back(loadgen::QosClassSpec{});
  return w;
}

// Service logs go where Bazel keeps them after the test
// (TEST_UNDECLARED_OUTPUTS_DIR), or to the scratch directory.
std::string LogPath(const std::string& name) {
  const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  return dir != nullptr ? absl::StrCat(dir, "/", name) : TestTmpPath(name);
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

// The p50 of send-to-rejection over every rejection group (weighted), and the
// largest p99.
struct RejectionLatency {
  int64_t count = 0;
  double p50_ms = 0;
  double p99_ms = 0;
};

RejectionLatency RejectionLatencyOf(const loadgen::RunResult& run) {
  std::vector<double> ms;
  for (const loadgen::RequestRecord& r : run.records) {
    if (r.planned.measured && loadgen::OutcomeOf(r) == loadgen::Outcome::kRejected) {
      ms.push_back(Ms(r.end - r.sent));
    }
  }
  const loadgen::LatencyStats s = loadgen::ComputeStats(ms);
  return {s.count, s.p50_ms, s.p99_ms};
}

void PrintRun(const std::string& name, const loadgen::RunResult& run) {
  const loadgen::Report& r = run.report;
  const RejectionLatency rl = RejectionLatencyOf(run);
  std::printf("\n=== %s\n%s", name.c_str(), loadgen::FormatReport(r).c_str());
  std::printf(
      "%s: attainment %s, goodput %.2f req/s, accepted %lld, rejected %lld, rejection latency "
      "p50 %.1f ms p99 %.1f ms, TTFT p50 %.0f p99 %.0f ms, TPOT p50 %.1f p99 %.1f ms\n",
      name.c_str(),
      r.slo_attainment.has_value() ? absl::StrFormat("%.3f", *r.slo_attainment).c_str() : "n/a",
      r.goodput_rps, static_cast<long long>(r.num_completed + r.num_failed),
      static_cast<long long>(r.num_rejected), rl.p50_ms, rl.p99_ms, r.ttft.p50_ms, r.ttft.p99_ms,
      r.tpot.p50_ms, r.tpot.p99_ms);
  std::fflush(stdout);
}

// The router's debug lines "request ... predicted ttft_ms P tpot_ms Q;
// actual ttft_ms A ... tpot_ms B ..." (remote_token_source.cc), read from
// `offset` on: how the admission's predictions compare with what happened.
void PrintPredictions(const std::string& name, const std::string& log_path, size_t offset) {
  std::ifstream in(log_path);
  in.seekg(static_cast<std::streamoff>(offset));
  std::string line;
  std::vector<double> ttft_ratio, tpot_ratio;
  int64_t ttft_under = 0, tpot_under = 0;
  while (std::getline(in, line)) {
    const size_t p = line.find("predicted ttft_ms ");
    if (p == std::string::npos) continue;
    double pt = 0, pp = 0, at = 0, td = 0, st = 0, ap = 0;
    if (std::sscanf(line.c_str() + p,
                    "predicted ttft_ms %lf tpot_ms %lf; actual ttft_ms %lf transfer_done_ms %lf "
                    "second_token_ms %lf tpot_ms %lf",
                    &pt, &pp, &at, &td, &st, &ap) != 6) {
      continue;
    }
    if (pt > 0) ttft_ratio.push_back(at / pt);
    if (pp > 0 && ap > 0) tpot_ratio.push_back(ap / pp);
    if (at > pt) ++ttft_under;
    if (ap > pp) ++tpot_under;
  }
  const loadgen::LatencyStats t = loadgen::ComputeStats(ttft_ratio);
  const loadgen::LatencyStats p = loadgen::ComputeStats(tpot_ratio);
  std::printf(
      "%s predictions (router-side actual / predicted) over %lld admitted: TTFT p50 %.2f p90 "
      "%.2f max %.2f (%lld above prediction); TPOT p50 %.2f p90 %.2f max %.2f (%lld above)\n",
      name.c_str(), static_cast<long long>(t.count), t.p50_ms, t.p90_ms, t.max_ms,
      static_cast<long long>(ttft_under), p.p50_ms, p.p90_ms, p.max_ms,
      static_cast<long long>(tpot_under));
  std::fflush(stdout);
}

size_t FileSize(const std::string& path) {
  std::ifstream in(path, std::ios::ate);
  return in ? static_cast<size_t>(in.tellg()) : 0;
}

class OverloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_dir_ = TestTmpPath("llama3-small");
    ASSERT_THAT(make_model::WriteModel(OverloadModelSpec(), model_dir_), IsOk());
    std::vector<std::string> prefill, decode;
    for (const char* name : {"prefill-0", "prefill-1", "decode-0", "decode-1"}) {
      const bool is_prefill = absl::string_view(name).substr(0, 7) == "prefill";
      auto worker = testing::StartService(
          {RunfilePath("services/worker/worker"),
           absl::StrCat("--role=", is_prefill ? "prefill" : "decode"),
           absl::StrCat("--worker_id=", name), "--pin_threads=false", "--cpu_threads=1",
           "--kv_cache_mb=128", "--ucx_transports=tcp", absl::StrCat("--model=", model_dir_)},
          LogPath(absl::StrCat(name, ".log")));
      ASSERT_THAT(worker, IsOk());
      workers_.push_back(*worker);
      (is_prefill ? prefill : decode).push_back(worker->address);
    }
    prefill_list_ = absl::StrJoin(prefill, ",");
    decode_list_ = absl::StrJoin(decode, ",");
  }

  void TearDown() override {
    StopRouter();
    for (ServiceProcess& w : workers_) EXPECT_THAT(testing::StopService(w), IsOk());
  }

  // (Re)starts the router; returns once it admits requests (it rejects them
  // with no_workers until every worker's load stream is up).
  void StartRouter(bool admission) {
    StopRouter();
    router_log_ = LogPath(absl::StrCat("router-admission-", admission ? "on" : "off", ".log"));
    auto router = testing::StartService(
        {RunfilePath("services/router/router"), absl::StrCat("--model=", model_dir_),
         absl::StrCat("--prefill_workers=", prefill_list_),
         absl::StrCat("--decode_workers=", decode_list_),
         absl::StrCat("--admission=", admission ? "true" : "false"), "--load_interval_ms=20",
         "--log_level=debug"},
        router_log_);
    ASSERT_THAT(router, IsOk());
    router_ = *router;
    auto stub = v1::Generation::NewStub(router_->channel);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    grpc::Status status;
    do {
      v1::GenerateRequest request;
      for (int32_t id = 1; id <= 8; ++id) request.mutable_token_ids()->add_ids(id);
      request.mutable_sampling()->set_max_tokens(2);
      request.mutable_stop()->set_ignore_eos(true);
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      auto reader = stub->Generate(&context, request);
      v1::GenerateResponse response;
      while (reader->Read(&response)) {
      }
      status = reader->Finish();
    } while (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && absl::Now() < deadline);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }

  void StopRouter() {
    if (router_.has_value()) {
      EXPECT_THAT(testing::StopService(*router_), IsOk());
    }
    router_.reset();
  }

  loadgen::RunResult Run(const loadgen::WorkloadSpec& workload, absl::Duration timeout) {
    loadgen::RunOptions options;
    options.target = router_->address;
    options.workload = workload;
    options.request_timeout = timeout;
    options.print_progress = false;
    absl::StatusOr<loadgen::RunResult> run = loadgen::RunLoad(options);
    EXPECT_THAT(run.status(), IsOk());
    return run.ok() ? *std::move(run) : loadgen::RunResult{};
  }

  void ExpectAllKvBlocksFree() {
    for (const ServiceProcess& w : workers_) {
      EXPECT_TRUE(testing::AllKvBlocksFree(w)) << "worker at " << w.address;
    }
  }

  std::string model_dir_;
  std::vector<ServiceProcess> workers_;
  std::string prefill_list_;
  std::string decode_list_;
  std::optional<ServiceProcess> router_;
  std::string router_log_;
};

TEST_F(OverloadTest, AdmissionKeepsAcceptedRequestsWithinSloAtTwiceCapacity) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  ASSERT_NO_FATAL_FAILURE(StartRouter(/*admission=*/true));

  // 1. Unloaded latencies. The first requests also warm the workers up.
  const loadgen::RunResult unloaded =
      Run(Workload(/*rate=*/2, absl::ZeroDuration(), /*num_requests=*/16), absl::Seconds(60));
  PrintRun("unloaded", unloaded);
  ASSERT_EQ(unloaded.report.num_completed, 16);
  const absl::Duration ttft_slo = absl::Milliseconds(kTtftSloFactor * unloaded.report.ttft.p50_ms);
  const absl::Duration tpot_slo = absl::Milliseconds(kTpotSloFactor * unloaded.report.tpot.p50_ms);
  std::printf(
      "unloaded TTFT p50 %.1f ms, TPOT p50 %.2f ms -> SLO targets TTFT %.0f ms, "
      "TPOT %.1f ms\n",
      unloaded.report.ttft.p50_ms, unloaded.report.tpot.p50_ms, Ms(ttft_slo), Ms(tpot_slo));

  // 2. Capacity: a burst without targets.
  const loadgen::RunResult burst =
      Run(Workload(/*rate=*/1000, absl::ZeroDuration(), kBurstRequests), absl::Seconds(120));
  PrintRun("capacity burst", burst);
  ASSERT_EQ(burst.report.num_completed, kBurstRequests);
  const double capacity = burst.report.request_throughput_rps;
  const double rate = kOverloadFactor * capacity;
  std::printf("capacity (saturated throughput) %.2f req/s -> overload rate %.2f req/s\n", capacity,
              rate);
  ASSERT_GT(capacity, 0);
  ExpectAllKvBlocksFree();

  loadgen::WorkloadSpec overload = Workload(rate, kOverloadDuration, 0);
  for (loadgen::QosClassSpec& c : overload.qos) c.slo = {ttft_slo, tpot_slo};
  overload.warmup = absl::Seconds(2);

  // 3. Admission on.
  size_t log_offset = FileSize(router_log_);
  const loadgen::RunResult on = Run(overload, absl::Seconds(120));
  PrintRun("admission on", on);
  PrintPredictions("admission on", router_log_, log_offset);
  ExpectAllKvBlocksFree();

  // 4. Admission off, same workers, same schedule.
  ASSERT_NO_FATAL_FAILURE(StartRouter(/*admission=*/false));
  log_offset = FileSize(router_log_);
  const loadgen::RunResult off = Run(overload, absl::Seconds(120));
  PrintRun("admission off", off);
  PrintPredictions("admission off", router_log_, log_offset);
  ExpectAllKvBlocksFree();

  const RejectionLatency on_rejections = RejectionLatencyOf(on);
  std::printf(
      "\nSUMMARY seed %llu capacity %.2f req/s, overload %.2f req/s, SLO TTFT %.0f ms TPOT "
      "%.1f ms\n  admission on:  attainment %.3f goodput %.2f req/s accepted %lld rejected %lld "
      "rejection p50 %.1f ms p99 %.1f ms\n  admission off: attainment %.3f goodput %.2f req/s "
      "accepted %lld rejected %lld\n",
      static_cast<unsigned long long>(kSeed), capacity, rate, Ms(ttft_slo), Ms(tpot_slo),
      on.report.slo_attainment.value_or(0), on.report.goodput_rps,
      static_cast<long long>(on.report.num_completed + on.report.num_failed),
      static_cast<long long>(on.report.num_rejected), on_rejections.p50_ms, on_rejections.p99_ms,
      off.report.slo_attainment.value_or(0), off.report.goodput_rps,
      static_cast<long long>(off.report.num_completed + off.report.num_failed),
      static_cast<long long>(off.report.num_rejected));

  // Admission on: most accepted requests meet their targets, some were
  // accepted, the overload was real (some rejected), rejections are fast.
  EXPECT_GT(on.report.goodput_rps, 0);
  EXPECT_GT(on.report.num_rejected, 0);
  ASSERT_TRUE(on.report.slo_attainment.has_value());
  EXPECT_GE(*on.report.slo_attainment, 0.95);
  EXPECT_LT(on_rejections.p99_ms, 50);
  // Admission off: everything is accepted and attainment collapses.
  EXPECT_EQ(off.report.num_rejected, 0);
  ASSERT_TRUE(off.report.slo_attainment.has_value());
  EXPECT_LT(*off.report.slo_attainment, 0.5);
}

}  // namespace
}  // namespace trident
