#include "common/numa/numa_topology.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace trident::numa {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::trident::testing::IsOk;
using ::trident::testing::IsOkAndHolds;
using ::trident::testing::StatusIs;

std::vector<int> AffinityMask() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  EXPECT_EQ(sched_getaffinity(0, sizeof(mask), &mask), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &mask)) cpus.push_back(cpu);
  }
  return cpus;
}

// Parses a /sys CPU list ("0-3,8"); an unreadable file reads as empty.
std::vector<int> ReadCpuList(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<int> cpus;
  if (!in || !std::getline(in, line)) return cpus;
  line = std::string(absl::StripAsciiWhitespace(line));
  if (line.empty()) return cpus;
  for (absl::string_view part : absl::StrSplit(line, ',')) {
    std::vector<absl::string_view> bounds = absl::StrSplit(part, '-');
    int first = 0;
    int last = 0;
    EXPECT_TRUE(absl::SimpleAtoi(bounds[0], &first)) << path;
    last = first;
    if (bounds.size() > 1) {
      EXPECT_TRUE(absl::SimpleAtoi(bounds[1], &last)) << path;
    }
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
  }
  return cpus;
}

std::vector<int> Intersect(const std::vector<int>& a, const std::vector<int>& b) {
  const std::set<int> in_b(b.begin(), b.end());
  std::vector<int> out;
  for (int x : a) {
    if (in_b.contains(x)) out.push_back(x);
  }
  return out;
}

TEST(NumaTopologyTest, ReadMatchesSysfsAndTheAffinityMask) {
  const std::vector<int> mask = AffinityMask();
  absl::StatusOr<NumaTopology> topology = NumaTopology::Read();
  ASSERT_THAT(topology, IsOk());
  ASSERT_FALSE(topology->nodes().empty());
  std::vector<int> all_node_cpus;
  for (const NumaNode& node : topology->nodes()) {
    if (topology->numa_available()) {
      const std::vector<int> sysfs =
          ReadCpuList(absl::StrCat("/sys/devices/system/node/node", node.id, "/cpulist"));
      EXPECT_EQ(node.cpus, Intersect(sysfs, mask)) << "node " << node.id;
    }
    all_node_cpus.insert(all_node_cpus.end(), node.cpus.begin(), node.cpus.end());
    for (int cpu : node.cpus) EXPECT_THAT(topology->NodeOfCpu(cpu), IsOkAndHolds(node.id));
    // One CPU per core: the lowest allowed sibling, every core of the node once.
    std::set<std::vector<int>> cores;
    for (int cpu : node.physical_cores) {
      const std::vector<int> siblings = ReadCpuList(
          absl::StrCat("/sys/devices/system/cpu/cpu", cpu, "/topology/thread_siblings_list"));
      EXPECT_TRUE(cores.insert(siblings).second) << "CPU " << cpu << " shares a core";
      EXPECT_EQ(Intersect(siblings, mask).front(), cpu);
    }
    for (int cpu : node.cpus) {
      EXPECT_TRUE(cores.contains(ReadCpuList(
          absl::StrCat("/sys/devices/system/cpu/cpu", cpu, "/topology/thread_siblings_list"))))
          << "the core of CPU " << cpu << " has no representative";
    }
  }
  std::sort(all_node_cpus.begin(), all_node_cpus.end());
  EXPECT_EQ(all_node_cpus, mask);
  EXPECT_THAT(topology->NodeOfCpu(mask.front()), IsOkAndHolds(topology->DefaultNode()));
}

TEST(NumaTopologyTest, UnknownNodeIsInvalidArgumentNamingTheNodesThatExist) {
  absl::StatusOr<NumaTopology> topology = NumaTopology::Read();
  ASSERT_THAT(topology, IsOk());
  const int missing = topology->nodes().back().id + 1;
  const std::string first = absl::StrCat(topology->nodes().front().id);
  EXPECT_THAT(topology->Node(missing),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node(s) " + first)));
  EXPECT_THAT(topology->PhysicalCores(missing), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(topology->Cpus(-1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(topology->NodeOfCpu(CPU_SETSIZE + 1), StatusIs(absl::StatusCode::kInvalidArgument));
}

// Two sockets of 4 cores with 2 SMT threads: CPU c and c + 8 share a core.
MachineDescription TwoNodeSmtMachine() {
  MachineDescription machine;
  machine.numa_available = true;
  machine.node_cpus = {{0, {0, 1, 2, 3, 8, 9, 10, 11}}, {1, {4, 5, 6, 7, 12, 13, 14, 15}}};
  for (int cpu = 0; cpu < 8; ++cpu) {
    machine.cpu_siblings[cpu] = {cpu, cpu + 8};
    machine.cpu_siblings[cpu + 8] = {cpu, cpu + 8};
  }
  for (int cpu = 0; cpu < 16; ++cpu) machine.allowed_cpus.push_back(cpu);
  return machine;
}

TEST(NumaTopologyTest, PhysicalCoresAreTheLowestSiblingOfEachCore) {
  absl::StatusOr<NumaTopology> topology = NumaTopology::FromDescription(TwoNodeSmtMachine());
  ASSERT_THAT(topology, IsOk());
  EXPECT_TRUE(topology->numa_available());
  EXPECT_THAT(topology->Cpus(1), IsOkAndHolds(ElementsAre(4, 5, 6, 7, 12, 13, 14, 15)));
  EXPECT_THAT(topology->PhysicalCores(0), IsOkAndHolds(ElementsAre(0, 1, 2, 3)));
  EXPECT_THAT(topology->PhysicalCores(1), IsOkAndHolds(ElementsAre(4, 5, 6, 7)));
  EXPECT_THAT(topology->NodeOfCpu(13), IsOkAndHolds(1));
  EXPECT_EQ(topology->DefaultNode(), 0);
}

TEST(NumaTopologyTest, MaskWithoutALowSiblingPicksTheAllowedOne) {
  MachineDescription machine = TwoNodeSmtMachine();
  // Node 0 is excluded; of node 1, core 4/12 only through CPU 12.
  machine.allowed_cpus = {5, 6, 12, 13};
  absl::StatusOr<NumaTopology> topology = NumaTopology::FromDescription(machine);
  ASSERT_THAT(topology, IsOk());
  EXPECT_THAT(topology->PhysicalCores(1), IsOkAndHolds(ElementsAre(5, 6, 12)));
  EXPECT_EQ(topology->DefaultNode(), 1);
  EXPECT_THAT(topology->PhysicalCores(0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("affinity mask")));
  EXPECT_THAT(topology->Cpus(0), StatusIs(absl::StatusCode::kFailedPrecondition));
  // The node still exists, and its CPUs still have a node.
  ASSERT_THAT(topology->Node(0), IsOk());
  EXPECT_THAT((*topology->Node(0))->cpus, IsEmpty());
  EXPECT_THAT(topology->NodeOfCpu(0), IsOkAndHolds(0));
}

TEST(NumaTopologyTest, MemoryOnlyNodeExistsWithoutCpus) {
  MachineDescription machine = TwoNodeSmtMachine();
  machine.node_cpus[3] = {};  // A CXL expander: memory, no CPUs, and a gap in the ids.
  absl::StatusOr<NumaTopology> topology = NumaTopology::FromDescription(machine);
  ASSERT_THAT(topology, IsOk());
  ASSERT_EQ(topology->nodes().size(), 3u);
  EXPECT_EQ(topology->nodes().back().id, 3);
  EXPECT_THAT(topology->PhysicalCores(3), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(topology->Node(2),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("node(s) 0, 1, 3")));
}

TEST(NumaTopologyTest, WithoutNumaSupportOneNodeHoldsEveryCpu) {
  MachineDescription machine = TwoNodeSmtMachine();
  machine.numa_available = false;
  machine.allowed_cpus = {2, 3, 10};
  absl::StatusOr<NumaTopology> topology = NumaTopology::FromDescription(machine);
  ASSERT_THAT(topology, IsOk());
  EXPECT_FALSE(topology->numa_available());
  ASSERT_EQ(topology->nodes().size(), 1u);
  EXPECT_EQ(topology->nodes()[0].id, 0);
  EXPECT_THAT(topology->Cpus(0), IsOkAndHolds(ElementsAre(2, 3, 10)));
  EXPECT_THAT(topology->PhysicalCores(0), IsOkAndHolds(ElementsAre(2, 3)));
  EXPECT_EQ(topology->DefaultNode(), 0);
}

TEST(NumaTopologyTest, CpusWithoutSiblingInformationAreCoresOfTheirOwn) {
  MachineDescription machine = TwoNodeSmtMachine();
  machine.cpu_siblings.clear();
  absl::StatusOr<NumaTopology> topology = NumaTopology::FromDescription(machine);
  ASSERT_THAT(topology, IsOk());
  EXPECT_THAT(topology->PhysicalCores(0), IsOkAndHolds(ElementsAre(0, 1, 2, 3, 8, 9, 10, 11)));
}

TEST(NumaTopologyTest, RejectsInconsistentDescriptions) {
  MachineDescription empty_mask = TwoNodeSmtMachine();
  empty_mask.allowed_cpus.clear();
  EXPECT_THAT(NumaTopology::FromDescription(empty_mask),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no CPU")));
  MachineDescription twice = TwoNodeSmtMachine();
  twice.node_cpus[1].push_back(0);
  EXPECT_THAT(NumaTopology::FromDescription(twice),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("CPU 0 is in nodes 0 and 1")));
  MachineDescription homeless = TwoNodeSmtMachine();
  homeless.allowed_cpus.push_back(99);
  EXPECT_THAT(NumaTopology::FromDescription(homeless),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("CPU 99")));
}

}  // namespace
}  // namespace trident::numa
