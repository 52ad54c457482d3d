#include "common/numa/numa_topology.h"

#include <numa.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace trident::numa {
namespace {

bool ReadLine(const std::string& path, std::string* line) {
  std::ifstream in(path);
  return in && std::getline(in, *line);
}

bool ReadInt(const std::string& path, int* value) {
  std::string line;
  return ReadLine(path, &line) && absl::SimpleAtoi(line, value);
}

// Parses a kernel CPU list such as "0-3,8,10-11". False if malformed.
bool ParseCpuList(absl::string_view text, std::vector<int>* cpus) {
  cpus->clear();
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return true;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::pair<absl::string_view, absl::string_view> bounds = absl::StrSplit(part, '-');
    int first = 0;
    int last = 0;
    if (!absl::SimpleAtoi(bounds.first, &first)) return false;
    last = first;
    if (!bounds.second.empty() && !absl::SimpleAtoi(bounds.second, &last)) return false;
    if (first < 0 || last < first) return false;
    for (int cpu = first; cpu <= last; ++cpu) cpus->push_back(cpu);
  }
  return true;
}

// The SMT siblings of `cpu` (itself included), from thread_siblings_list, or
// else every CPU of `all_cpus` with the same package and core id. Empty if
// neither can be read.
std::vector<int> ReadSiblings(int cpu, const std::vector<int>& all_cpus) {
  const std::string dir = absl::StrCat("/sys/devices/system/cpu/cpu", cpu, "/topology/");
  std::string line;
  std::vector<int> siblings;
  if (ReadLine(dir + "thread_siblings_list", &line) && ParseCpuList(line, &siblings) &&
      !siblings.empty()) {
    return siblings;
  }
  int package = 0;
  int core = 0;
  if (!ReadInt(dir + "physical_package_id", &package) || !ReadInt(dir + "core_id", &core)) {
    return {};
  }
  siblings.clear();
  for (int other : all_cpus) {
    const std::string other_dir = absl::StrCat("/sys/devices/system/cpu/cpu", other, "/topology/");
    int other_package = 0;
    int other_core = 0;
    if (ReadInt(other_dir + "physical_package_id", &other_package) &&
        ReadInt(other_dir + "core_id", &other_core) && other_package == package &&
        other_core == core) {
      siblings.push_back(other);
    }
  }
  return siblings;
}

// Every existing node's CPUs, from libnuma. REQUIRES: numa_available() >= 0.
absl::StatusOr<std::map<int, std::vector<int>>> NodeCpusFromLibnuma() {
  std::map<int, std::vector<int>> node_cpus;
  struct bitmask* cpus = numa_allocate_cpumask();
  const int max_node = numa_max_node();
  for (int node = 0; node <= max_node; ++node) {
    if (!numa_bitmask_isbitset(numa_nodes_ptr, node)) continue;
    if (numa_node_to_cpus(node, cpus) != 0) {
      const int error = errno;
      numa_free_cpumask(cpus);
      return absl::InternalError(
          absl::StrCat("numa_node_to_cpus(", node, "): ", std::strerror(error)));
    }
    std::vector<int>& list = node_cpus[node];
    for (unsigned int cpu = 0; cpu < cpus->size; ++cpu) {
      if (numa_bitmask_isbitset(cpus, cpu)) list.push_back(static_cast<int>(cpu));
    }
  }
  numa_free_cpumask(cpus);
  return node_cpus;
}

}  // namespace

absl::StatusOr<std::vector<int>> AllowedCpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) {
    return absl::InternalError(absl::StrCat("sched_getaffinity: ", std::strerror(errno)));
  }
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &mask)) cpus.push_back(cpu);
  }
  return cpus;
}

absl::StatusOr<NumaTopology> NumaTopology::Read() {
  MachineDescription description;
  absl::StatusOr<std::vector<int>> allowed = AllowedCpus();
  if (!allowed.ok()) return allowed.status();
  description.allowed_cpus = *std::move(allowed);
  description.numa_available = ::numa_available() >= 0;
  std::vector<int> all_cpus;
  if (description.numa_available) {
    absl::StatusOr<std::map<int, std::vector<int>>> node_cpus = NodeCpusFromLibnuma();
    if (!node_cpus.ok()) return node_cpus.status();
    description.node_cpus = *std::move(node_cpus);
    for (const auto& [node, cpus] : description.node_cpus) {
      all_cpus.insert(all_cpus.end(), cpus.begin(), cpus.end());
    }
  } else {
    all_cpus = description.allowed_cpus;
  }
  std::sort(all_cpus.begin(), all_cpus.end());
  for (int cpu : description.allowed_cpus) {
    std::vector<int> siblings = ReadSiblings(cpu, all_cpus);
    if (!siblings.empty()) description.cpu_siblings[cpu] = std::move(siblings);
  }
  return FromDescription(description);
}

absl::StatusOr<NumaTopology> NumaTopology::FromDescription(const MachineDescription& description) {
  if (description.allowed_cpus.empty()) {
    return absl::InvalidArgumentError("NumaTopology: the affinity mask holds no CPU");
  }
  std::map<int, std::vector<int>> node_cpus = description.node_cpus;
  if (!description.numa_available) {
    node_cpus = {{0, description.allowed_cpus}};
  }
  NumaTopology topology;
  topology.numa_available_ = description.numa_available;
  for (const auto& [node, cpus] : node_cpus) {
    for (int cpu : cpus) {
      if (!topology.node_of_cpu_.emplace(cpu, node).second) {
        return absl::InvalidArgumentError(absl::StrCat("NumaTopology: CPU ", cpu, " is in nodes ",
                                                       topology.node_of_cpu_[cpu], " and ", node));
      }
    }
  }
  const std::set<int> allowed(description.allowed_cpus.begin(), description.allowed_cpus.end());
  for (int cpu : allowed) {
    if (!topology.node_of_cpu_.contains(cpu)) {
      return absl::InvalidArgumentError(
          absl::StrCat("NumaTopology: CPU ", cpu, " of the affinity mask is in no node"));
    }
  }
  for (const auto& [id, cpus] : node_cpus) {
    NumaNode node;
    node.id = id;
    // A core is named by its lowest sibling; its representative is the
    // lowest sibling the mask allows (CPUs ascend, so the first one seen).
    std::set<int> cores_seen;
    std::vector<int> sorted = cpus;
    std::sort(sorted.begin(), sorted.end());
    for (int cpu : sorted) {
      if (!allowed.contains(cpu)) continue;
      node.cpus.push_back(cpu);
      auto siblings = description.cpu_siblings.find(cpu);
      const int core = siblings == description.cpu_siblings.end() || siblings->second.empty()
                           ? cpu
                           : *std::min_element(siblings->second.begin(), siblings->second.end());
      if (cores_seen.insert(core).second) node.physical_cores.push_back(cpu);
    }
    topology.nodes_.push_back(std::move(node));
  }
  topology.default_node_ = topology.node_of_cpu_.at(*allowed.begin());
  return topology;
}

std::string NumaTopology::NodeIdsForMessage() const {
  std::vector<int> ids;
  for (const NumaNode& node : nodes_) ids.push_back(node.id);
  return absl::StrJoin(ids, ", ");
}

absl::StatusOr<const NumaNode*> NumaTopology::Node(int node) const {
  for (const NumaNode& candidate : nodes_) {
    if (candidate.id == node) return &candidate;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "NUMA node ", node, " does not exist; this machine has node(s) ", NodeIdsForMessage()));
}

absl::StatusOr<std::vector<int>> NumaTopology::Cpus(int node) const {
  absl::StatusOr<const NumaNode*> found = Node(node);
  if (!found.ok()) return found.status();
  if ((*found)->cpus.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("NUMA node ", node, " has no CPU in this process's affinity mask"));
  }
  return (*found)->cpus;
}

absl::StatusOr<std::vector<int>> NumaTopology::PhysicalCores(int node) const {
  absl::StatusOr<const NumaNode*> found = Node(node);
  if (!found.ok()) return found.status();
  if ((*found)->physical_cores.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("NUMA node ", node, " has no CPU in this process's affinity mask"));
  }
  return (*found)->physical_cores;
}

absl::StatusOr<int> NumaTopology::NodeOfCpu(int cpu) const {
  auto it = node_of_cpu_.find(cpu);
  if (it == node_of_cpu_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("CPU ", cpu, " is in no NUMA node"));
  }
  return it->second;
}

}  // namespace trident::numa
