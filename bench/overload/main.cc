// The overload scenario of tests/testing/overload_scenario.h as a
// benchmark: prints every phase's report and the SUMMARY figures
// (attainment, goodput, rejection latency with admission on and off).
// bench/overload.sh builds and runs it.

#include <cstdio>
#include <cstdlib>
#include <vector>
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
ABSL_FLAG(std::string, scenario, "overload",
          "overload (SLO admission at --overload_factor x capacity), light (false rejections "
          "below saturation with each TTFT calibration) or soak (growth of RSS, open files and "
          "KV blocks at --soak_factor x capacity).");
ABSL_FLAG(std::vector<std::string>, fractions, std::vector<std::string>({"0.1", "0.2", "0.3"}),
          "light: loads, as fractions of the measured capacity.");
ABSL_FLAG(int32_t, phase_seconds, 40, "light: length of each phase.");
ABSL_FLAG(double, soak_factor, 1.5, "soak: load as a multiple of the measured capacity.");
ABSL_FLAG(double, soak_minutes, 10, "soak: length of the soak.");
ABSL_FLAG(double, warmup_minutes, 2, "soak: minutes left out of the growth fits.");

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
  const std::string scenario = absl::GetFlag(FLAGS_scenario);
  if (scenario == "light") {
    trident::testing::LightLoadOptions light{.cluster = options};
    light.fractions.clear();
    for (const std::string& f : absl::GetFlag(FLAGS_fractions)) light.fractions.push_back(std::atof(f.c_str()));
    light.phase_duration = absl::Seconds(absl::GetFlag(FLAGS_phase_seconds));
    absl::StatusOr<trident::testing::LightLoadResult> r = trident::testing::RunLightLoadScenario(light);
    if (!r.ok()) {
      std::fprintf(stderr, "overload: %s\n", r.status().ToString().c_str());
      return 1;
    }
    std::printf("\n%s", trident::testing::LightLoadSummary(light, *r).c_str());
    return 0;
  }
  if (scenario == "soak") {
    trident::testing::SoakOptions soak{.cluster = options};
    soak.load_factor = absl::GetFlag(FLAGS_soak_factor);
    soak.duration = absl::Seconds(60 * absl::GetFlag(FLAGS_soak_minutes));
    soak.warmup = absl::Seconds(60 * absl::GetFlag(FLAGS_warmup_minutes));
    absl::StatusOr<trident::testing::SoakResult> r = trident::testing::RunSoakScenario(soak);
    if (!r.ok()) {
      std::fprintf(stderr, "overload: %s\n", r.status().ToString().c_str());
      return 1;
    }
    std::printf("\n%s", trident::testing::SoakSummary(soak, *r).c_str());
    return 0;
  }
  if (scenario != "overload") {
    std::fprintf(stderr, "overload: --scenario must be overload, light or soak\n");
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
