#include "common/numa/numa_binding.h"

#include <numaif.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "common/numa/numa_topology.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::numa {
namespace {

using ::testing::Each;
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

const long kPageBytes = sysconf(_SC_PAGESIZE);

// Binding changes the calling thread's policy and mask, which the thread's
// later tests would inherit, so each binding test binds a thread of its own.
template <typename Fn>
void OnFreshThread(Fn fn) {
  std::thread thread(fn);
  thread.join();
}

TEST(BindProcessToNodeTest, SetsBindPolicyAndTheNodesCpus) {
  absl::StatusOr<NumaTopology> topology = NumaTopology::Read();
  ASSERT_THAT(topology, IsOk());
  ASSERT_TRUE(topology->numa_available()) << "this test needs a NUMA-capable kernel";
  const int node = topology->DefaultNode();
  OnFreshThread([&] {
    ASSERT_THAT(BindProcessToNode(*topology, node), IsOk());
    absl::StatusOr<ThreadMemoryPolicy> policy = GetThreadMemoryPolicy();
    ASSERT_THAT(policy, IsOk());
    EXPECT_EQ(policy->mode, MPOL_BIND);
    EXPECT_THAT(policy->nodes, ElementsAre(node));
    EXPECT_EQ(ThreadAffinity(), *topology->Cpus(node));

    // A thread created now inherits both, and its memory lands on the node.
    std::thread child([&] {
      absl::StatusOr<ThreadMemoryPolicy> inherited = GetThreadMemoryPolicy();
      ASSERT_THAT(inherited, IsOk());
      EXPECT_EQ(inherited->mode, MPOL_BIND);
      EXPECT_EQ(ThreadAffinity(), *topology->Cpus(node));
      const size_t bytes = 16 * kPageBytes;
      void* memory =
          mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      ASSERT_NE(memory, MAP_FAILED);
      std::memset(memory, 1, bytes);
      EXPECT_THAT(NodesOfPages(memory, bytes), IsOkAndHolds(Each(node)));
      EXPECT_THAT(NodeOfAddress(static_cast<char*>(memory) + bytes - 1), IsOkAndHolds(node));
      munmap(memory, bytes);
    });
    child.join();
  });
}

TEST(BindProcessToNodeTest, PreferredPolicyIsPreferred) {
  absl::StatusOr<NumaTopology> topology = NumaTopology::Read();
  ASSERT_THAT(topology, IsOk());
  ASSERT_TRUE(topology->numa_available());
  const int node = topology->DefaultNode();
  OnFreshThread([&] {
    ASSERT_THAT(BindProcessToNode(*topology, node, MemoryPolicy::kPreferred), IsOk());
    absl::StatusOr<ThreadMemoryPolicy> policy = GetThreadMemoryPolicy();
    ASSERT_THAT(policy, IsOk());
    EXPECT_EQ(policy->mode, MPOL_PREFERRED);
    EXPECT_THAT(policy->nodes, ElementsAre(node));
  });
}

TEST(BindProcessToNodeTest, NodeThatDoesNotExistIsInvalidArgumentAndChangesNothing) {
  absl::StatusOr<NumaTopology> topology = NumaTopology::Read();
  ASSERT_THAT(topology, IsOk());
  const int missing = topology->nodes().back().id + 1;
  OnFreshThread([&] {
    const std::vector<int> mask = ThreadAffinity();
    EXPECT_THAT(BindProcessToNode(*topology, missing),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("does not exist")));
    absl::StatusOr<ThreadMemoryPolicy> policy = GetThreadMemoryPolicy();
    ASSERT_THAT(policy, IsOk());
    EXPECT_EQ(policy->mode, MPOL_DEFAULT);
    EXPECT_EQ(ThreadAffinity(), mask);
  });
}

TEST(BindProcessToNodeTest, NodeOutsideTheAffinityMaskIsFailedPrecondition) {
  MachineDescription machine;
  machine.numa_available = true;
  machine.node_cpus = {{0, {0}}, {1, {1}}};
  machine.allowed_cpus = {0};
  absl::StatusOr<NumaTopology> topology = NumaTopology::FromDescription(machine);
  ASSERT_THAT(topology, IsOk());
  // Fails before any system call, so the described node 1 never reaches the kernel.
  EXPECT_THAT(BindProcessToNode(*topology, 1), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(NodesOfPagesTest, ReportsUntouchedUnmappedAndPlacedPages) {
  absl::StatusOr<NumaTopology> topology = NumaTopology::Read();
  ASSERT_THAT(topology, IsOk());
  ASSERT_TRUE(topology->numa_available());
  char* memory = static_cast<char*>(
      mmap(nullptr, 3 * kPageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(memory, MAP_FAILED);
  ASSERT_EQ(munmap(memory + kPageBytes, kPageBytes), 0);  // A hole in the middle.
  memory[2 * kPageBytes] = 1;
  absl::StatusOr<std::vector<int>> nodes = NodesOfPages(memory + 10, 3 * kPageBytes - 10);
  ASSERT_THAT(nodes, IsOk());
  ASSERT_EQ(nodes->size(), 3u);
  EXPECT_EQ((*nodes)[0], -ENOENT);  // Never touched: not present.
  EXPECT_EQ((*nodes)[1], -EFAULT);  // Not mapped.
  EXPECT_THAT(topology->Node((*nodes)[2]), IsOk());
  // Both queries agree on a written page.
  memory[0] = 1;
  absl::StatusOr<int> node = NodeOfAddress(memory);
  ASSERT_THAT(node, IsOk());
  EXPECT_THAT(NodesOfPages(memory, 1), IsOkAndHolds(ElementsAre(*node)));
  EXPECT_THAT(NodeOfAddress(memory + kPageBytes), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(NodesOfPages(memory, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  munmap(memory, kPageBytes);
  munmap(memory + 2 * kPageBytes, kPageBytes);
}

}  // namespace
}  // namespace trident::numa
