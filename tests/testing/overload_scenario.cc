#include "tests/testing/overload_scenario.h"

#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <thread>
#include <utility>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "bench/loadgen/runner.h"
#include "common/status/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "tests/testing/service_process.h"
#include "common/model/generate/model_gen.h"
#include "trident/v1/generation.grpc.pb.h"
#include "trident/v1/worker.grpc.pb.h"

namespace trident::testing {
namespace {

namespace v1 = ::trident::v1;

// A model large enough that the workers' compute, not the RPCs around it,
// is what saturates the CPU: llama3-tiny's layout at 512 hidden, 4 layers
// (12M parameters, ~5 ms per decode step on one core).
model::generate::ModelSpec OverloadModelSpec() {
  model::generate::ModelSpec spec = *model::generate::PresetSpec("llama3-tiny");
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
loadgen::WorkloadSpec Workload(uint64_t seed, double rate, absl::Duration duration,
                               int64_t num_requests) {
  loadgen::WorkloadSpec w;
  w.seed = seed;
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

// ShareGPT-like prompt lengths: lognormal (median 150 tokens, sigma 1 in
// log space: a long tail) clipped to [16, 1024], as 256 rows drawn with the
// seed; outputs 16 to 64.
loadgen::WorkloadSpec ShareGptLikeWorkload(uint64_t seed, double rate, absl::Duration duration,
                                           int64_t num_requests) {
  loadgen::WorkloadSpec w = Workload(seed, rate, duration, num_requests);
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> prompt(std::log(150.0), 1.0);
  std::uniform_int_distribution<int32_t> output(16, 64);
  w.prompt_tokens.csv_rows.clear();
  for (int i = 0; i < 256; ++i) {
    w.prompt_tokens.csv_rows.push_back(
        {static_cast<int32_t>(std::clamp(prompt(rng), 16.0, 1024.0)), output(rng)});
  }
  w.prompt_tokens.spec = "lognormal(median 150, sigma 1) clipped to [16, 1024]";
  w.output_tokens = w.prompt_tokens;
  w.output_tokens.column = loadgen::LengthColumn::kOutput;
  w.output_tokens.spec = "uniform 16..64 (rows)";
  return w;
}

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

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
    double pt = 0, pp = 0, at = 0, td = 0, ap = 0;
    if (std::sscanf(line.c_str() + p,
                    "predicted ttft_ms %lf tpot_ms %lf; actual ttft_ms %lf transfer_done_ms %lf "
                    "tpot_ms %lf",
                    &pt, &pp, &at, &td, &ap) != 5) {
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

// The four workers, and a router in front of them that can be restarted.
class OverloadCluster {
 public:
  explicit OverloadCluster(const OverloadOptions& options) : options_(options) {}
  ~OverloadCluster() {
    StopRouter();
    for (ServiceProcess& w : workers_) (void)StopService(w);
  }

  absl::Status StartWorkers() {
    model_dir_ = absl::StrCat(options_.scratch_dir, "/llama3-small");
    TRIDENT_RETURN_IF_ERROR(model::generate::WriteModel(OverloadModelSpec(), model_dir_));
    std::vector<std::string> prefill, decode;
    for (const char* name : {"prefill-0", "prefill-1", "decode-0", "decode-1"}) {
      const bool is_prefill = absl::string_view(name).substr(0, 7) == "prefill";
      TRIDENT_ASSIGN_OR_RETURN(
          ServiceProcess worker,
          StartService({options_.worker_bin,
                        absl::StrCat("--role=", is_prefill ? "prefill" : "decode"),
                        absl::StrCat("--worker_id=", name), "--pin_threads=false",
                        "--cpu_threads=1", "--kv_cache_mb=128", "--ucx_transports=tcp",
                        absl::StrCat("--model=", model_dir_)},
                       absl::StrCat(options_.log_dir, "/", name, ".log")));
      workers_.push_back(worker);
      (is_prefill ? prefill : decode).push_back(worker.address);
    }
    prefill_list_ = absl::StrJoin(prefill, ",");
    decode_list_ = absl::StrJoin(decode, ",");
    return absl::OkStatus();
  }

  // (Re)starts the router; returns once it admits requests (it rejects them
  // with no_workers until every worker's load stream is up).
  absl::Status StartRouter(bool admission, const std::vector<std::string>& extra_flags = {}) {
    StopRouter();
    router_log_ = absl::StrCat(options_.log_dir, "/router-admission-",
                               admission ? "on" : "off", ".log");
    std::vector<std::string> argv = {options_.router_bin,
                                     absl::StrCat("--model=", model_dir_),
                                     absl::StrCat("--prefill_workers=", prefill_list_),
                                     absl::StrCat("--decode_workers=", decode_list_),
                                     absl::StrCat("--admission=", admission ? "true" : "false"),
                                     "--load_interval_ms=20",
                                     "--log_level=debug"};
    argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
    TRIDENT_ASSIGN_OR_RETURN(router_, StartService(argv, router_log_));
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
    } while (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
             absl::Now() < deadline);
    if (!status.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the router never served a request: ", status.error_message()));
    }
    return absl::OkStatus();
  }

  void StopRouter() {
    if (router_.has_value()) (void)StopService(*router_);
    router_.reset();
  }

  absl::StatusOr<loadgen::RunResult> Run(const loadgen::WorkloadSpec& workload,
                                         absl::Duration timeout) {
    loadgen::RunOptions run;
    run.target = router_->address;
    run.workload = workload;
    run.request_timeout = timeout;
    run.print_progress = false;
    return loadgen::RunLoad(run);
  }

  bool AllKvBlocksFreeOnEveryWorker() {
    bool all = true;
    for (const ServiceProcess& w : workers_) {
      if (!AllKvBlocksFree(w)) {
        std::printf("KV blocks still held on the worker at %s\n", w.address.c_str());
        all = false;
      }
    }
    return all;
  }

  const std::string& router_log() const { return router_log_; }

  // (name, pid) of the router and every worker.
  std::vector<std::pair<std::string, pid_t>> Processes() const {
    std::vector<std::pair<std::string, pid_t>> out;
    if (router_.has_value()) out.emplace_back("router", router_->pid);
    const char* names[] = {"prefill-0", "prefill-1", "decode-0", "decode-1"};
    for (size_t i = 0; i < workers_.size() && i < 4; ++i) out.emplace_back(names[i], workers_[i].pid);
    return out;
  }
  const std::vector<ServiceProcess>& workers() const { return workers_; }

 private:
  const OverloadOptions options_;
  std::string model_dir_;
  std::vector<ServiceProcess> workers_;
  std::string prefill_list_;
  std::string decode_list_;
  std::optional<ServiceProcess> router_;
  std::string router_log_;
};

}  // namespace

absl::StatusOr<OverloadResult> RunOverloadScenario(const OverloadOptions& options) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(options.seed));
  OverloadCluster cluster(options);
  TRIDENT_RETURN_IF_ERROR(cluster.StartWorkers());
  TRIDENT_RETURN_IF_ERROR(cluster.StartRouter(/*admission=*/true));
  OverloadResult result;

  // 1. Unloaded latencies. The first requests also warm the workers up.
  TRIDENT_ASSIGN_OR_RETURN(
      result.unloaded,
      cluster.Run(Workload(options.seed, /*rate=*/2, absl::ZeroDuration(), 16), absl::Seconds(60)));
  PrintRun("unloaded", result.unloaded);
  if (result.unloaded.report.num_completed != 16) {
    return absl::InternalError("not every unloaded request completed");
  }
  result.ttft_slo =
      absl::Milliseconds(options.ttft_slo_factor * result.unloaded.report.ttft.p50_ms);
  result.tpot_slo =
      absl::Milliseconds(options.tpot_slo_factor * result.unloaded.report.tpot.p50_ms);

  // 2. Capacity: a burst without targets.
  TRIDENT_ASSIGN_OR_RETURN(result.burst,
                           cluster.Run(Workload(options.seed, /*rate=*/1000, absl::ZeroDuration(),
                                                options.burst_requests),
                                       absl::Seconds(120)));
  PrintRun("capacity burst", result.burst);
  if (result.burst.report.num_completed != options.burst_requests) {
    return absl::InternalError("not every request of the burst completed");
  }
  result.capacity_rps = result.burst.report.request_throughput_rps;
  result.overload_rps = options.overload_factor * result.capacity_rps;
  result.kv_blocks_free_after_each_phase &= cluster.AllKvBlocksFreeOnEveryWorker();

  loadgen::WorkloadSpec overload =
      Workload(options.seed, result.overload_rps, options.overload_duration, 0);
  for (loadgen::QosClassSpec& c : overload.qos) c.slo = {result.ttft_slo, result.tpot_slo};
  overload.warmup = absl::Seconds(2);

  // 3. Admission on.
  size_t log_offset = FileSize(cluster.router_log());
  TRIDENT_ASSIGN_OR_RETURN(result.admission_on, cluster.Run(overload, absl::Seconds(120)));
  PrintRun("admission on", result.admission_on);
  PrintPredictions("admission on", cluster.router_log(), log_offset);
  result.kv_blocks_free_after_each_phase &= cluster.AllKvBlocksFreeOnEveryWorker();
  result.on_rejections = RejectionLatencyOf(result.admission_on);

  // 4. Admission off, same workers, same schedule.
  TRIDENT_RETURN_IF_ERROR(cluster.StartRouter(/*admission=*/false));
  log_offset = FileSize(cluster.router_log());
  TRIDENT_ASSIGN_OR_RETURN(result.admission_off, cluster.Run(overload, absl::Seconds(120)));
  PrintRun("admission off", result.admission_off);
  PrintPredictions("admission off", cluster.router_log(), log_offset);
  result.kv_blocks_free_after_each_phase &= cluster.AllKvBlocksFreeOnEveryWorker();
  return result;
}

std::string OverloadSummary(const OverloadOptions& options, const OverloadResult& r) {
  const loadgen::Report& on = r.admission_on.report;
  const loadgen::Report& off = r.admission_off.report;
  return absl::StrFormat(
      "SUMMARY seed %llu capacity %.2f req/s, overload %.2f req/s, SLO TTFT %.0f ms TPOT %.1f ms\n"
      "  admission on:  attainment %.3f goodput %.2f req/s accepted %lld rejected %lld failed "
      "%lld rejection p50 %.1f ms p99 %.1f ms\n"
      "  admission off: attainment %.3f goodput %.2f req/s accepted %lld rejected %lld failed "
      "%lld\n",
      static_cast<unsigned long long>(options.seed), r.capacity_rps, r.overload_rps,
      Ms(r.ttft_slo), Ms(r.tpot_slo), on.slo_attainment.value_or(0), on.goodput_rps,
      static_cast<long long>(on.num_completed + on.num_failed),
      static_cast<long long>(on.num_rejected), static_cast<long long>(on.num_failed),
      r.on_rejections.p50_ms, r.on_rejections.p99_ms, off.slo_attainment.value_or(0),
      off.goodput_rps, static_cast<long long>(off.num_completed + off.num_failed),
      static_cast<long long>(off.num_rejected), static_cast<long long>(off.num_failed));
}

namespace {

// Unloaded latencies (the SLOs) and the capacity, on `workload`'s lengths.
struct Baseline {
  absl::Duration ttft_slo;
  absl::Duration tpot_slo;
  double capacity_rps = 0;
  absl::Duration ttft_p99;
  absl::Duration tpot_p99;
};

absl::StatusOr<Baseline> MeasureBaseline(
    OverloadCluster& cluster, const OverloadOptions& options,
    const std::function<loadgen::WorkloadSpec(double, absl::Duration, int64_t)>& workload) {
  TRIDENT_ASSIGN_OR_RETURN(loadgen::RunResult unloaded,
                           cluster.Run(workload(2, absl::ZeroDuration(), 16), absl::Seconds(120)));
  PrintRun("unloaded", unloaded);
  TRIDENT_ASSIGN_OR_RETURN(
      loadgen::RunResult burst,
      cluster.Run(workload(1000, absl::ZeroDuration(), options.burst_requests),
                  absl::Seconds(300)));
  PrintRun("capacity burst", burst);
  if (unloaded.report.num_completed != 16 ||
      burst.report.num_completed != options.burst_requests) {
    return absl::InternalError("not every unloaded or burst request completed");
  }
  return Baseline{
      .ttft_slo = absl::Milliseconds(options.ttft_slo_factor * unloaded.report.ttft.p50_ms),
      .tpot_slo = absl::Milliseconds(options.tpot_slo_factor * unloaded.report.tpot.p50_ms),
      .capacity_rps = burst.report.request_throughput_rps,
      .ttft_p99 = absl::Milliseconds(unloaded.report.ttft.p99_ms),
      .tpot_p99 = absl::Milliseconds(unloaded.report.tpot.p99_ms)};
}

// Starts `cluster` and measures its baseline on ShareGPT-like lengths.
absl::StatusOr<Baseline> StartShareGptLike(OverloadCluster& cluster, const OverloadOptions& o) {
  std::printf("seed %llu\n", static_cast<unsigned long long>(o.seed));
  TRIDENT_RETURN_IF_ERROR(cluster.StartWorkers());
  TRIDENT_RETURN_IF_ERROR(cluster.StartRouter(/*admission=*/true));
  return MeasureBaseline(cluster, o, [&](double rate, absl::Duration duration, int64_t n) {
    return ShareGptLikeWorkload(o.seed, rate, duration, n);
  });
}

// VmRSS of `pid` in MiB, and its open files; -1 when unreadable.
std::pair<double, double> RssAndFiles(pid_t pid) {
  double rss = -1;
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::atof(line.c_str() + 6) / 1024.0;
  }
  double files = -1;
  if (DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str()); dir != nullptr) {
    files = 0;
    while (readdir(dir) != nullptr) ++files;
    closedir(dir);
    files -= 2;  // "." and "..".
  }
  return {rss, files};
}

// KV blocks a worker has in use now (its next load sample); -1 if none.
double KvBlocksInUse(const ServiceProcess& worker) {
  const std::optional<v1::WorkerLoad> load = NextLoadSample(worker.channel);
  return load.has_value() ? static_cast<double>(load->kv_blocks_total() - load->kv_blocks_free())
                          : -1;
}

// Least-squares slope of (t, y), per minute.
double SlopePerMinute(const std::vector<std::pair<double, double>>& points) {
  const double n = static_cast<double>(points.size());
  if (n < 2) return 0;
  double mt = 0, my = 0;
  for (const auto& [t, y] : points) mt += t / n, my += y / n;
  double stt = 0, sty = 0;
  for (const auto& [t, y] : points) stt += (t - mt) * (t - mt), sty += (t - mt) * (y - my);
  return stt > 0 ? 60 * sty / stt : 0;
}

}  // namespace

absl::StatusOr<LightLoadResult> RunLightLoadScenario(const LightLoadOptions& options) {
  const OverloadOptions& o = options.cluster;
  OverloadCluster cluster(o);
  TRIDENT_ASSIGN_OR_RETURN(const Baseline baseline, StartShareGptLike(cluster, o));
  auto workload = [&](double rate, absl::Duration duration, int64_t n) {
    return ShareGptLikeWorkload(o.seed, rate, duration, n);
  };
  LightLoadResult result{.capacity_rps = baseline.capacity_rps,
                         .ttft_slo = options.slo_factor_of_p99 * baseline.ttft_p99,
                         .tpot_slo = options.slo_factor_of_p99 * baseline.tpot_p99};
  struct Router {
    const char* name;
    bool admission;
    const char* flag;
  };
  const Router routers[] = {{"admission off", false, "--admission_learn_ttft_overhead=true"},
                            {"factor only", true, "--admission_learn_ttft_overhead=false"},
                            {"overhead learned", true, "--admission_learn_ttft_overhead=true"}};
  for (const double fraction : options.fractions) {
    loadgen::WorkloadSpec w =
        workload(fraction * baseline.capacity_rps, options.phase_duration, 0);
    for (loadgen::QosClassSpec& c : w.qos) c.slo = {result.ttft_slo, result.tpot_slo};
    w.warmup = absl::Seconds(5);
    for (const Router& router : routers) {
      TRIDENT_RETURN_IF_ERROR(cluster.StartRouter(router.admission, {router.flag}));
      TRIDENT_ASSIGN_OR_RETURN(loadgen::RunResult run, cluster.Run(w, absl::Seconds(120)));
      const std::string name = absl::StrFormat("%.1f of capacity, %s", fraction, router.name);
      PrintRun(name, run);
      result.phases.push_back({fraction, fraction * baseline.capacity_rps, router.name,
                               run.report});
    }
  }
  return result;
}

std::string LightLoadSummary(const LightLoadOptions& options, const LightLoadResult& r) {
  std::string out = absl::StrFormat(
      "SUMMARY light load, seed %llu: capacity %.2f req/s, SLO TTFT %.0f ms TPOT %.1f ms, "
      "ShareGPT-like prompts\n",
      static_cast<unsigned long long>(options.cluster.seed), r.capacity_rps, Ms(r.ttft_slo),
      Ms(r.tpot_slo));
  for (const LightLoadPhase& p : r.phases) {
    const double measured = static_cast<double>(std::max<int64_t>(p.report.num_measured, 1));
    absl::StrAppendFormat(&out,
                          "  %.1f of capacity (%.2f req/s) %-16s: refused %5.2f%% (%lld of %lld), "
                          "attainment %.3f, TTFT p50 %.0f p99 %.0f ms\n",
                          p.fraction, p.rate_rps, p.router, 100 * p.report.num_rejected / measured,
                          static_cast<long long>(p.report.num_rejected),
                          static_cast<long long>(p.report.num_measured),
                          p.report.slo_attainment.value_or(0), p.report.ttft.p50_ms,
                          p.report.ttft.p99_ms);
  }
  return out;
}

absl::StatusOr<SoakResult> RunSoakScenario(const SoakOptions& options) {
  const OverloadOptions& o = options.cluster;
  OverloadCluster cluster(o);
  TRIDENT_ASSIGN_OR_RETURN(const Baseline baseline, StartShareGptLike(cluster, o));
  auto workload = [&](double rate, absl::Duration duration, int64_t n) {
    return ShareGptLikeWorkload(o.seed, rate, duration, n);
  };
  SoakResult result{.capacity_rps = baseline.capacity_rps,
                    .rate_rps = options.load_factor * baseline.capacity_rps};
  loadgen::WorkloadSpec w = workload(result.rate_rps, options.duration, 0);
  for (loadgen::QosClassSpec& c : w.qos) c.slo = {baseline.ttft_slo, baseline.tpot_slo};
  w.warmup = options.warmup;

  // The load runs on its own thread; this one samples until it ends.
  absl::StatusOr<loadgen::RunResult> run = absl::UnknownError("not run");
  absl::Notification done;
  std::thread load([&] {
    run = cluster.Run(w, absl::Seconds(120));
    done.Notify();
  });
  // (series key) -> (seconds since start, value), after the warm-up.
  std::map<std::pair<std::string, std::string>, std::vector<std::pair<double, double>>> samples;
  const absl::Time start = absl::Now();
  while (!done.WaitForNotificationWithTimeout(options.sample_interval)) {
    const double t = absl::ToDoubleSeconds(absl::Now() - start);
    if (absl::Seconds(t) < options.warmup) continue;
    for (const auto& [name, pid] : cluster.Processes()) {
      const auto [rss, files] = RssAndFiles(pid);
      if (rss >= 0) samples[{name, "RSS MiB"}].emplace_back(t, rss);
      if (files >= 0) samples[{name, "open files"}].emplace_back(t, files);
    }
    const char* names[] = {"prefill-0", "prefill-1", "decode-0", "decode-1"};
    for (size_t i = 0; i < cluster.workers().size() && i < 4; ++i) {
      const double used = KvBlocksInUse(cluster.workers()[i]);
      if (used >= 0) samples[{names[i], "KV blocks used"}].emplace_back(t, used);
    }
  }
  load.join();
  if (!run.ok()) return run.status();
  PrintRun("soak", *run);
  result.report = run->report;
  for (const auto& [key, points] : samples) {
    if (points.empty()) continue;
    result.series.push_back({key.first, key.second, points.front().second,
                             points.back().second, SlopePerMinute(points)});
  }
  result.kv_blocks_free_after = cluster.AllKvBlocksFreeOnEveryWorker();
  return result;
}

std::string SoakSummary(const SoakOptions& options, const SoakResult& r) {
  std::string out = absl::StrFormat(
      "SUMMARY soak, seed %llu: %.1f min at %.2f req/s (%.1fx capacity %.2f req/s), admission "
      "on; attainment %.3f of accepted, goodput %.2f req/s, accepted %lld, refused %lld, failed "
      "%lld; every KV block free after: %s\n  growth after a %.0f s warm-up (least squares):\n",
      static_cast<unsigned long long>(options.cluster.seed),
      absl::ToDoubleMinutes(options.duration), r.rate_rps, options.load_factor, r.capacity_rps,
      r.report.slo_attainment.value_or(0), r.report.goodput_rps,
      static_cast<long long>(r.report.num_completed + r.report.num_failed),
      static_cast<long long>(r.report.num_rejected), static_cast<long long>(r.report.num_failed),
      r.kv_blocks_free_after ? "yes" : "NO", absl::ToDoubleSeconds(options.warmup));
  for (const SoakSeries& s : r.series) {
    absl::StrAppendFormat(&out, "    %-10s %-15s %9.1f -> %9.1f  %+8.3f per minute\n", s.name,
                          s.what, s.first, s.last, s.slope_per_minute);
  }
  return out;
}

}  // namespace trident::testing
