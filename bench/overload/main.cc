// The overload scenario of tests/testing/overload_scenario.h as a
// benchmark: prints every phase's report and the SUMMARY figures
// (attainment, goodput, rejection latency with admission on and off).
// bench/overload.sh builds and runs it.

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "tests/testing/overload_scenario.h"

ABSL_FLAG(std::string, worker_bin, "", "The worker binary.");
ABSL_FLAG(std::string, router_bin, "", "The router binary.");
ABSL_FLAG(std::string, scratch_dir, "/tmp/trident-overload", "Where the model and logs go.");
ABSL_FLAG(uint64_t, seed, 20240611, "Seed of the arrival schedule and lengths.");
ABSL_FLAG(double, overload_factor, 2, "Arrival rate as a multiple of the measured capacity.");
ABSL_FLAG(int32_t, overload_seconds, 15, "Length of each overload phase.");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  trident::testing::OverloadOptions options;
  options.worker_bin = absl::GetFlag(FLAGS_worker_bin);
  options.router_bin = absl::GetFlag(FLAGS_router_bin);
  options.scratch_dir = absl::GetFlag(FLAGS_scratch_dir);
  options.log_dir = options.scratch_dir;
  options.seed = absl::GetFlag(FLAGS_seed);
  options.overload_factor = absl::GetFlag(FLAGS_overload_factor);
  options.overload_duration = absl::Seconds(absl::GetFlag(FLAGS_overload_seconds));
  if (options.worker_bin.empty() || options.router_bin.empty()) {
    std::fprintf(stderr, "overload: --worker_bin and --router_bin are required\n");
    return 2;
  }
  absl::StatusOr<trident::testing::OverloadResult> result =
      trident::testing::RunOverloadScenario(options);
  if (!result.ok()) {
    std::fprintf(stderr, "overload: %s\n", result.status().ToString().c_str());
    return 1;
  }
  std::printf("\n%s", trident::testing::OverloadSummary(options, *result).c_str());
  return 0;
}
