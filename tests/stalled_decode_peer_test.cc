// A stalled decode worker holds up only the prompts bound for it: one
// prefill worker serves two decode workers, and its transfers to one of
// them stall after the first layer (--testonly_stall_kv_transfer_after_layers
// with --testonly_stall_kv_transfer_to). Requests to the other decode worker
// still complete, with a time to first token within twice that of the same
// requests before the stall (plus a little for a loaded machine), and every
// KV block is free again once the stalled request is cancelled.

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/testing/runfiles.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/disaggregated_call.h"
#include "tests/testing/fixture_models.h"
#include "tests/testing/service_process.h"

namespace trident {
namespace {

using testing::DisaggregatedContexts;
using testing::DisaggregatedResult;
using testing::GenerateDisaggregated;
using testing::IsOk;
using testing::RunfilePath;
using testing::ServiceProcess;
using testing::TestTmpPath;

constexpr int kRequests = 6;
constexpr int32_t kMaxTokens = 8;

// A worker in `role` with its KV over UCX's tcp transport.
absl::StatusOr<ServiceProcess> StartWorker(const std::string& model_dir, const std::string& role,
                                           const std::string& name,
                                           std::vector<std::string> extra = {}) {
  std::vector<std::string> argv =
      testing::SmallCpuWorkerArgv(RunfilePath("services/worker/worker"), model_dir, role, name);
  argv.push_back("--ucx_transports=tcp");
  argv.insert(argv.end(), extra.begin(), extra.end());
  return testing::StartService(argv, TestTmpPath(absl::StrCat(name, ".log")));
}

std::vector<int32_t> Prompt(int i) {
  std::vector<int32_t> prompt;
  for (int32_t t = 0; t < 24; ++t) prompt.push_back(1 + (7 * i + 3 * t) % 200);
  return prompt;
}

// The median time to first token of kRequests requests to `decode`, one
// after another; each must complete with all its tokens.
absl::Duration MedianTtft(const ServiceProcess& prefill, const ServiceProcess& decode,
                          const std::string& tag) {
  std::vector<absl::Duration> ttfts;
  for (int i = 0; i < kRequests; ++i) {
    DisaggregatedContexts contexts;
    const DisaggregatedResult r = GenerateDisaggregated(
        prefill, decode, absl::StrCat(tag, "-", i), Prompt(i), kMaxTokens, &contexts);
    EXPECT_TRUE(r.ok()) << tag << " request " << i << ": reserve "
                        << r.reserve_status.error_message() << " prefill "
                        << r.prefill_status.error_message() << " decode "
                        << r.decode_status.error_message();
    EXPECT_EQ(r.tokens.size(), kMaxTokens) << tag << " request " << i;
    ttfts.push_back(r.time_to_first_token);
  }
  std::sort(ttfts.begin(), ttfts.end());
  return ttfts[ttfts.size() / 2];
}

TEST(StalledDecodePeerTest, RequestsToAnotherDecodeWorkerAreUnaffected) {
  const std::string model_dir = TestTmpPath("llama3-tiny");
  ASSERT_THAT(testing::EnsureFixtureModel("llama3-tiny", model_dir), IsOk());
  auto healthy = StartWorker(model_dir, "decode", "decode-healthy");
  ASSERT_THAT(healthy, IsOk());
  auto stalled = StartWorker(model_dir, "decode", "decode-stalled");
  ASSERT_THAT(stalled, IsOk());
  auto prefill = StartWorker(model_dir, "prefill", "prefill",
                             {"--testonly_stall_kv_transfer_after_layers=1",
                              "--testonly_stall_kv_transfer_to=decode-stalled"});
  ASSERT_THAT(prefill, IsOk());

  const absl::Duration before = MedianTtft(*prefill, *healthy, "before");

  // A request to the stalled decode worker: its first token arrives, then
  // its transfer stops after one layer and holds its destination's queue.
  DisaggregatedContexts stuck_contexts;
  DisaggregatedResult stuck;
  absl::Notification stuck_first_token;
  std::thread stuck_thread([&] {
    stuck = GenerateDisaggregated(*prefill, *stalled, "stuck", Prompt(99), kMaxTokens,
                                  &stuck_contexts, &stuck_first_token);
  });
  stuck_first_token.WaitForNotification();

  const absl::Duration during = MedianTtft(*prefill, *healthy, "during");
  std::printf("median time to first token to the healthy decode worker: %.1f ms before, %.1f ms "
              "while the other decode worker's transfer is stalled\n",
              absl::ToDoubleMilliseconds(before), absl::ToDoubleMilliseconds(during));
  EXPECT_LE(during, 2 * before + absl::Milliseconds(50));

  stuck_contexts.Cancel();
  stuck_thread.join();
  EXPECT_FALSE(stuck.prefill_status.ok());
  for (ServiceProcess* p : {&*prefill, &*healthy, &*stalled}) {
    EXPECT_TRUE(testing::AllKvBlocksFree(*p)) << "worker at " << p->address;
    EXPECT_THAT(testing::StopService(*p), IsOk());
  }
}

}  // namespace
}  // namespace trident
