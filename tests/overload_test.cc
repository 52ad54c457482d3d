// Overload through real processes (tests/testing/overload_scenario.h): 2
// prefill + 2 decode CPU workers behind a router at twice the cluster's
// measured capacity, with SLO admission on and then off.
//
// What it asserts is behaviour, with margins that hold on a loaded 2-core
// machine: admission on rejects part of the overload (RESOURCE_EXHAUSTED
// with RetryInfo) and serves the rest better than admission off does; with
// admission off nothing is rejected and no request fails (requests that
// find a decode worker's KV cache full wait for room); rejections come back
// faster than accepted requests' first tokens; no KV block is left held.
// The precise figures (attainment, goodput, rejection latency) are what
// bench/overload.sh reports.

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/overload_scenario.h"
#include "common/testing/runfiles.h"

namespace trident {
namespace {

using ::trident::testing::IsOk;
using ::trident::testing::RunfilePath;
using ::trident::testing::TestTmpPath;

// Service logs go where Bazel keeps them after the test
// (TEST_UNDECLARED_OUTPUTS_DIR), or to the scratch directory.
std::string LogDir() {
  const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  return dir != nullptr ? std::string(dir) : TestTmpPath("");
}

TEST(OverloadTest, AdmissionRejectsPartOfAnOverloadAndServesTheRestBetterThanNoAdmission) {
  testing::OverloadOptions options;
  options.worker_bin = RunfilePath("services/worker/worker");
  options.router_bin = RunfilePath("services/router/router");
  options.scratch_dir = TestTmpPath("");
  options.log_dir = LogDir();
  absl::StatusOr<testing::OverloadResult> result = testing::RunOverloadScenario(options);
  ASSERT_THAT(result.status(), IsOk());
  std::printf("\n%s", testing::OverloadSummary(options, *result).c_str());
  const loadgen::Report& on = result->admission_on.report;
  const loadgen::Report& off = result->admission_off.report;

  // Admission on: the overload was real (some rejected), some were served
  // within their targets, and better than without admission.
  EXPECT_GT(on.num_rejected, 0);
  EXPECT_GT(on.goodput_rps, 0);
  ASSERT_TRUE(on.slo_attainment.has_value());
  ASSERT_TRUE(off.slo_attainment.has_value());
  EXPECT_GT(*on.slo_attainment, *off.slo_attainment);
  EXPECT_GE(*on.slo_attainment, 0.5);
  // Rejections are decided at the door: faster than a first token.
  EXPECT_LT(result->on_rejections.p50_ms, on.ttft.p50_ms);
  // Admission off: everything is accepted, and nothing fails for a full KV
  // cache (those requests wait for room).
  EXPECT_EQ(off.num_rejected, 0);
  EXPECT_EQ(off.num_failed, 0);
  EXPECT_EQ(on.num_failed, 0);
  EXPECT_TRUE(result->kv_blocks_free_after_each_phase);
}

}  // namespace
}  // namespace trident
