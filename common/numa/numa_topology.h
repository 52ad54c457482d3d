#ifndef TRIDENT_COMMON_NUMA_NUMA_TOPOLOGY_H_
#define TRIDENT_COMMON_NUMA_NUMA_TOPOLOGY_H_

// The machine's NUMA nodes as this process may use them: which nodes exist,
// which CPUs of each node the process's affinity mask allows, and one CPU per
// physical core of each node (no SMT siblings), for pinning one kernel thread
// per core.
//
//   TRIDENT_ASSIGN_OR_RETURN(numa::NumaTopology topology, numa::NumaTopology::Read());
//   const int node = topology.DefaultNode();
//   TRIDENT_ASSIGN_OR_RETURN(std::vector<int> cores, topology.PhysicalCores(node));
//
// A machine or kernel without NUMA support (libnuma's numa_available() < 0)
// reads as one node, 0, holding every CPU of the affinity mask.
//
// The topology is a snapshot: CPUs hot-plugged or an affinity mask changed
// after `Read()` are not seen. NumaTopology is a value (copyable); its const
// methods are thread-safe.

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace trident::numa {

// One NUMA node. Every list is ascending.
struct NumaNode {
  int id = 0;
  // The node's CPUs that the affinity mask allows. Empty for a memory-only
  // node (CXL, HBM) or a node the mask excludes.
  std::vector<int> cpus;
  // One CPU per physical core with an allowed CPU: the lowest-numbered allowed
  // SMT sibling of the core. A subset of `cpus`.
  std::vector<int> physical_cores;
};

// What `NumaTopology::Read()` gathers from libnuma, /sys and
// sched_getaffinity; built by hand in tests to describe other machines.
struct MachineDescription {
  bool numa_available = false;
  // Every CPU of each existing node (ignoring the affinity mask). When
  // `numa_available` is false this is ignored and node 0 holds the CPUs of
  // `allowed_cpus`.
  std::map<int, std::vector<int>> node_cpus;
  // A CPU's SMT siblings including itself (thread_siblings_list). A CPU
  // missing here counts as a core of its own.
  std::map<int, std::vector<int>> cpu_siblings;
  // The process's affinity mask.
  std::vector<int> allowed_cpus;
};

// The CPUs of the calling thread's affinity mask (sched_getaffinity), in
// CPU order. kInternal if it cannot be read.
absl::StatusOr<std::vector<int>> AllowedCpus();

class NumaTopology {
 public:
  // Reads the topology of this machine for this process: nodes from libnuma
  // (numa_max_node, numa_nodes_ptr, numa_node_to_cpus), SMT siblings from
  // /sys/devices/system/cpu/cpuN/topology/thread_siblings_list (falling back
  // to physical_package_id + core_id), the mask from sched_getaffinity.
  // Returns kInternal if the affinity mask or a node's CPUs cannot be read.
  static absl::StatusOr<NumaTopology> Read();

  // Builds a topology from `description`. Returns kInvalidArgument if the
  // mask is empty, or (with NUMA) a CPU of the mask belongs to no node or a
  // CPU belongs to two nodes.
  static absl::StatusOr<NumaTopology> FromDescription(const MachineDescription& description);

  // Whether the kernel supports NUMA; false means the one-node fallback.
  bool numa_available() const { return numa_available_; }

  // Every existing node, ascending by id (ids may have gaps).
  const std::vector<NumaNode>& nodes() const { return nodes_; }

  // The node `node`. kInvalidArgument, naming the nodes that exist, if there
  // is no such node. The pointer lives as long as this topology.
  absl::StatusOr<const NumaNode*> Node(int node) const;

  // The node's allowed CPUs / one CPU per physical core (see NumaNode).
  // kInvalidArgument if the node does not exist (naming those that do);
  // kFailedPrecondition if the affinity mask allows none of its CPUs.
  absl::StatusOr<std::vector<int>> Cpus(int node) const;
  absl::StatusOr<std::vector<int>> PhysicalCores(int node) const;

  // The node that CPU `cpu` belongs to, whether or not the mask allows it.
  // kInvalidArgument if no node holds that CPU.
  absl::StatusOr<int> NodeOfCpu(int cpu) const;

  // The node of the lowest-numbered CPU of the affinity mask: where a process
  // started under `numactl --cpunodebind=N` (or in a cpuset) runs.
  int DefaultNode() const { return default_node_; }

 private:
  NumaTopology() = default;

  // The ids of every node, for error messages: "0, 1".
  std::string NodeIdsForMessage() const;

  bool numa_available_ = false;
  std::vector<NumaNode> nodes_;
  std::map<int, int> node_of_cpu_;
  int default_node_ = 0;
};

}  // namespace trident::numa

#endif  // TRIDENT_COMMON_NUMA_NUMA_TOPOLOGY_H_
