// loadgen: open-loop load generator for trident.v1.Generation.
//
//   loadgen --target=127.0.0.1:50051 --rate=5 --duration_s=60
//       --prompt_tokens=uniform:64:512 --output_tokens=fixed:128
//       --qos=interactive:0.3:ttft=200:tpot=50,batch:0.7 --seed=1 --json_out=/tmp/run.json
//
// Prints a summary on stdout, a progress line every second on stderr, and
// writes the full report as JSON. Exit status: 0 when the run completed
// (whatever the server answered), 1 when it could not run, 2 for bad flags.

#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/runner.h"
#include "bench/loadgen/workload.h"
#include "common/logging/log.h"
#include "common/status/status_macros.h"

ABSL_FLAG(std::string, target, "", "host:port of the Generation server (router or worker).");
ABSL_FLAG(std::string, model, "", "GenerateRequest.model; empty means the served model.");
ABSL_FLAG(double, rate, 1.0, "Mean arrival rate, requests per second.");
ABSL_FLAG(std::string, arrival, "poisson", "Arrival process: poisson or gamma.");
ABSL_FLAG(double, gamma_shape, 1.0,
          "Shape k of gamma inter-arrival gaps (--arrival=gamma): 1 is Poisson, below 1 is "
          "burstier.");
ABSL_FLAG(double, duration_s, 0, "Send arrivals for this many seconds (0: use --num_requests).");
ABSL_FLAG(int64_t, num_requests, 0,
          "Send this many requests (0: use --duration_s); with both, the first limit reached.");
ABSL_FLAG(std::string, prompt_tokens, "fixed:128",
          "Prompt length: fixed:N, uniform:A:B or csv:PATH (columns prompt_tokens,output_tokens).");
ABSL_FLAG(std::string, output_tokens, "fixed:128",
          "Output length, generated exactly (ignore_eos): fixed:N, uniform:A:B or csv:PATH.");
ABSL_FLAG(double, ttft_slo_ms, 0, "Default TTFT target in ms for every class (0: none).");
ABSL_FLAG(double, tpot_slo_ms, 0, "Default TPOT target in ms for every class (0: none).");
ABSL_FLAG(std::string, qos, "",
          "QoS mix: NAME[:WEIGHT][:ttft=MS][:tpot=MS],... e.g. "
          "interactive:0.3:ttft=200:tpot=50,batch:0.7. Empty: the server's default class.");
ABSL_FLAG(uint64_t, seed, 0, "Seed of the schedule (arrivals, lengths, classes, prompts).");
ABSL_FLAG(std::string, json_out, "", "Write the JSON report here.");
ABSL_FLAG(std::string, requests_csv, "",
          "Write one CSV row per measured request here (outcome, lengths, TTFT, TPOT, E2E, SLO "
          "met), for latency distributions.");
ABSL_FLAG(int64_t, max_inflight, 1000,
          "Requests in flight at most; requests due beyond it are dropped and counted.");
ABSL_FLAG(double, warmup_s, 0, "Requests scheduled in the first seconds are left out of metrics.");
ABSL_FLAG(double, request_timeout_s, 600, "Deadline of each request.");
ABSL_FLAG(double, connect_timeout_s, 30, "How long to wait for the server's ModelInfo.");
ABSL_FLAG(int32_t, num_channels, 4, "gRPC connections the requests are spread over.");
ABSL_FLAG(bool, progress, true, "Print a progress line to stderr every second.");

namespace trident::loadgen {
namespace {

absl::StatusOr<std::optional<absl::Duration>> OptionalMs(double ms, const char* flag) {
  if (!std::isfinite(ms) || ms < 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": must be >= 0, got ", ms));
  }
  if (ms == 0) return std::optional<absl::Duration>();
  return std::optional<absl::Duration>(absl::Milliseconds(ms));
}

absl::StatusOr<RunOptions> OptionsFromFlags() {
  RunOptions o;
  o.target = absl::GetFlag(FLAGS_target);
  if (o.target.empty()) return absl::InvalidArgumentError("--target: required (host:port)");
  o.model = absl::GetFlag(FLAGS_model);
  WorkloadSpec& w = o.workload;
  w.seed = absl::GetFlag(FLAGS_seed);
  TRIDENT_ASSIGN_OR_RETURN(w.arrival.kind, ParseArrivalKind(absl::GetFlag(FLAGS_arrival)));
  w.arrival.rate_per_s = absl::GetFlag(FLAGS_rate);
  w.arrival.gamma_shape = absl::GetFlag(FLAGS_gamma_shape);
  const double duration_s = absl::GetFlag(FLAGS_duration_s);
  const double warmup_s = absl::GetFlag(FLAGS_warmup_s);
  const double timeout_s = absl::GetFlag(FLAGS_request_timeout_s);
  if (!std::isfinite(duration_s) || duration_s < 0) {
    return absl::InvalidArgumentError("--duration_s: must be >= 0");
  }
  if (!std::isfinite(warmup_s) || warmup_s < 0) {
    return absl::InvalidArgumentError("--warmup_s: must be >= 0");
  }
  if (!std::isfinite(timeout_s) || timeout_s <= 0) {
    return absl::InvalidArgumentError("--request_timeout_s: must be > 0");
  }
  const double connect_s = absl::GetFlag(FLAGS_connect_timeout_s);
  if (!std::isfinite(connect_s) || connect_s <= 0) {
    return absl::InvalidArgumentError("--connect_timeout_s: must be > 0");
  }
  o.connect_timeout = absl::Seconds(connect_s);
  w.duration = absl::Seconds(duration_s);
  w.warmup = absl::Seconds(warmup_s);
  w.num_requests = absl::GetFlag(FLAGS_num_requests);
  TRIDENT_ASSIGN_OR_RETURN(w.prompt_tokens,
                           ParseLengthDistribution(absl::GetFlag(FLAGS_prompt_tokens),
                                                   LengthColumn::kPrompt, "--prompt_tokens"));
  TRIDENT_ASSIGN_OR_RETURN(w.output_tokens,
                           ParseLengthDistribution(absl::GetFlag(FLAGS_output_tokens),
                                                   LengthColumn::kOutput, "--output_tokens"));
  SloTargets slo;
  TRIDENT_ASSIGN_OR_RETURN(slo.ttft, OptionalMs(absl::GetFlag(FLAGS_ttft_slo_ms), "--ttft_slo_ms"));
  TRIDENT_ASSIGN_OR_RETURN(slo.tpot, OptionalMs(absl::GetFlag(FLAGS_tpot_slo_ms), "--tpot_slo_ms"));
  TRIDENT_ASSIGN_OR_RETURN(w.qos, ParseQosMix(absl::GetFlag(FLAGS_qos), slo));
  o.max_in_flight = absl::GetFlag(FLAGS_max_inflight);
  o.request_timeout = absl::Seconds(timeout_s);
  o.num_channels = absl::GetFlag(FLAGS_num_channels);
  o.print_progress = absl::GetFlag(FLAGS_progress);
  // Flag errors surface here rather than after connecting.
  TRIDENT_RETURN_IF_ERROR(GenerateSchedule(w).status());
  return o;
}

int Main() {
  absl::StatusOr<RunOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "loadgen: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  std::fprintf(stderr, "loadgen: seed=%llu target=%s\n",
               static_cast<unsigned long long>(options->workload.seed), options->target.c_str());
  absl::StatusOr<RunResult> result = RunLoad(*options);
  if (!result.ok()) {
    std::fprintf(stderr, "loadgen: %s\n", result.status().ToString().c_str());
    return 1;
  }
  std::printf("%s", FormatReport(result->report).c_str());
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    std::ofstream out(json_out);
    out << result->json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    out.close();
    if (!out) {
      std::fprintf(stderr, "loadgen: cannot write --json_out=%s\n", json_out.c_str());
      return 1;
    }
    std::printf("wrote %s\n", json_out.c_str());
  }
  const std::string requests_csv = absl::GetFlag(FLAGS_requests_csv);
  if (!requests_csv.empty()) {
    std::ofstream out(requests_csv);
    out << RequestsCsv(result->records, result->start);
    out.close();
    if (!out) {
      std::fprintf(stderr, "loadgen: cannot write --requests_csv=%s\n", requests_csv.c_str());
      return 1;
    }
    std::printf("wrote %s\n", requests_csv.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace trident::loadgen

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Open-loop load generator for trident.v1.Generation.");
  absl::ParseCommandLine(argc, argv);
  trident::log::InitLoggingFromFlags();
  return trident::loadgen::Main();
}
