#include "common/numa/spin_pool.h"

#include <sched.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/numa/numa_topology.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::numa {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::trident::testing::IsOk;
using ::trident::testing::IsOkAndHolds;
using ::trident::testing::StatusIs;

// The calling thread's mask.
std::vector<int> ThreadAffinity() {
  absl::StatusOr<std::vector<int>> cpus = AllowedCpus();
  EXPECT_TRUE(cpus.ok()) << cpus.status();
  return cpus.ok() ? *cpus : std::vector<int>{};
}

std::string Siblings(int cpu) {
  std::ifstream in(
      absl::StrCat("/sys/devices/system/cpu/cpu", cpu, "/topology/thread_siblings_list"));
  std::string line;
  std::getline(in, line);
  return line.empty() ? absl::StrCat("cpu", cpu) : line;
}

std::unique_ptr<SpinPool> PoolOnDefaultNode(absl::Duration spin_window, int num_threads = 0) {
  absl::StatusOr<NumaTopology> topology = NumaTopology::Read();
  EXPECT_THAT(topology, IsOk());
  absl::StatusOr<std::unique_ptr<SpinPool>> pool =
      SpinPool::CreateOnNode(*topology, topology->DefaultNode(), num_threads, spin_window);
  EXPECT_THAT(pool, IsOk());
  return pool.ok() ? *std::move(pool) : nullptr;
}

TEST(SpinPoolTest, EachWorkerRunsOnlyOnItsCpuOneThreadPerPhysicalCoreOfTheNode) {
  absl::StatusOr<NumaTopology> topology = NumaTopology::Read();
  ASSERT_THAT(topology, IsOk());
  const int node = topology->DefaultNode();
  absl::StatusOr<std::unique_ptr<SpinPool>> pool = SpinPool::CreateOnNode(*topology, node);
  ASSERT_THAT(pool, IsOk());
  EXPECT_THAT(topology->PhysicalCores(node), IsOkAndHolds((*pool)->threads()));
  const int n = (*pool)->num_threads();
  std::vector<int> ran_on(n, -1);
  std::vector<std::vector<int>> masks(n);
  (*pool)->Run([&](int thread) {
    ran_on[thread] = sched_getcpu();
    masks[thread] = ThreadAffinity();
  });
  std::set<std::string> cores;
  for (int i = 0; i < n; ++i) {
    const int cpu = (*pool)->threads()[i];
    EXPECT_EQ(ran_on[i], cpu) << "worker " << i;
    EXPECT_THAT(masks[i], ElementsAre(cpu)) << "worker " << i;
    EXPECT_THAT(topology->NodeOfCpu(cpu), IsOkAndHolds(node));
    EXPECT_TRUE(cores.insert(Siblings(cpu)).second) << "CPU " << cpu << " shares a core";
  }
}

TEST(SpinPoolTest, RunsEveryIndexExactlyOncePerRunOver10000Runs) {
  std::unique_ptr<SpinPool> pool = PoolOnDefaultNode(absl::Milliseconds(5));
  ASSERT_NE(pool, nullptr);
  const int n = pool->num_threads();
  std::vector<int> counts(n, 0);  // Each written only by its worker.
  std::vector<int> last_run(n, -1);
  for (int run = 0; run < 10000; ++run) {
    pool->Run([&](int thread) {
      ++counts[thread];
      last_run[thread] = run;
    });
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(counts[i], run + 1) << "worker " << i << " after run " << run;
      ASSERT_EQ(last_run[i], run);
    }
  }
}

TEST(SpinPoolTest, RunAfterTheWorkersFellAsleepCompletes) {
  // A zero window: workers block right after every job.
  std::unique_ptr<SpinPool> pool = PoolOnDefaultNode(absl::ZeroDuration());
  ASSERT_NE(pool, nullptr);
  const int n = pool->num_threads();
  std::atomic<int> calls{0};
  for (int run = 0; run < 200; ++run) {
    // Wait (without sleeping) until every worker is in its futex wait.
    while (pool->num_sleeping_workers_for_testing() < n) std::this_thread::yield();
    pool->Run([&](int) { calls.fetch_add(1); });
    ASSERT_EQ(calls.load(), (run + 1) * n);
  }
  EXPECT_GE(pool->num_worker_sleeps(), 200 * n);
}

TEST(SpinPoolTest, InfiniteWindowNeverSleeps) {
  std::unique_ptr<SpinPool> pool = PoolOnDefaultNode(absl::InfiniteDuration(), 1);
  ASSERT_NE(pool, nullptr);
  std::atomic<int> calls{0};
  for (int run = 0; run < 1000; ++run) pool->Run([&](int) { calls.fetch_add(1); });
  EXPECT_EQ(calls.load(), 1000);
  EXPECT_EQ(pool->num_worker_sleeps(), 0);
}

TEST(SpinPoolTest, ConcurrentRunsAreSerialized) {
  std::unique_ptr<SpinPool> pool = PoolOnDefaultNode(absl::Milliseconds(1));
  ASSERT_NE(pool, nullptr);
  const int n = pool->num_threads();
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> calls{0};
  auto caller = [&] {
    for (int run = 0; run < 500; ++run) {
      pool->Run([&](int) {
        if (inside.fetch_add(1) >= n) overlaps.fetch_add(1);
        calls.fetch_add(1);
        inside.fetch_sub(1);
      });
    }
  };
  std::thread a(caller);
  std::thread b(caller);
  a.join();
  b.join();
  EXPECT_EQ(calls.load(), 2 * 500 * n);
  EXPECT_EQ(overlaps.load(), 0);
}

TEST(SpinPoolTest, CreateRejectsBadCpuLists) {
  const std::vector<int> mask = ThreadAffinity();
  EXPECT_THAT(SpinPool::Create({.cpus = {}}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(SpinPool::Create({.cpus = {mask[0], mask[0]}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("twice")));
  EXPECT_THAT(SpinPool::Create({.cpus = {CPU_SETSIZE + 3}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not in the affinity mask")));
  EXPECT_THAT(SpinPool::Create({.cpus = {mask[0]}, .spin_window = absl::Milliseconds(-1)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  std::vector<int> too_many = mask;
  too_many.push_back(mask.back() + 1);
  EXPECT_THAT(SpinPool::Create({.cpus = too_many}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("affinity mask holds only")));
}

TEST(SpinPoolTest, MoreThreadsThanTheAffinityMaskAllowsIsInvalidArgument) {
  const std::vector<int> mask = ThreadAffinity();
  // On a thread confined to one CPU, two workers cannot each have their own.
  std::thread confined([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(mask[0], &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    EXPECT_THAT(SpinPool::Create({.cpus = {mask[0], mask[0] + 1}}),
                StatusIs(absl::StatusCode::kInvalidArgument));
    absl::StatusOr<NumaTopology> topology = NumaTopology::Read();
    ASSERT_THAT(topology, IsOk());
    const int node = topology->DefaultNode();
    EXPECT_THAT(SpinPool::CreateOnNode(*topology, node, /*num_threads=*/2),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 physical cores")));
    absl::StatusOr<std::unique_ptr<SpinPool>> one_worker =
        SpinPool::CreateOnNode(*topology, node, /*num_threads=*/1);
    ASSERT_THAT(one_worker, IsOk());
    EXPECT_THAT((*one_worker)->threads(), ElementsAre(mask[0]));
  });
  confined.join();
}

TEST(SpinPoolTest, CreateOnNodeRejectsUnknownNodesAndNegativeCounts) {
  absl::StatusOr<NumaTopology> topology = NumaTopology::Read();
  ASSERT_THAT(topology, IsOk());
  EXPECT_THAT(SpinPool::CreateOnNode(*topology, topology->nodes().back().id + 1),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not exist")));
  EXPECT_THAT(SpinPool::CreateOnNode(*topology, topology->DefaultNode(), -1),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace trident::numa
