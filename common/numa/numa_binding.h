#ifndef TRIDENT_COMMON_NUMA_NUMA_BINDING_H_
#define TRIDENT_COMMON_NUMA_NUMA_BINDING_H_

// Binding a process to one NUMA node, and asking the kernel where memory
// lives.
//
//   // In main(), before any other thread exists:
//   TRIDENT_ASSIGN_OR_RETURN(numa::NumaTopology topology, numa::NumaTopology::Read());
//   TRIDENT_RETURN_IF_ERROR(numa::BindProcessToNode(topology, node));
//
// Linux keeps the memory policy and the CPU affinity per thread, and a new
// thread inherits both from the thread that creates it. "Process" binding
// therefore means: the calling thread, and every thread it (or its
// descendants) creates afterwards. Threads that already exist keep their
// policy and mask, so bind first thing in main(). Nothing here is cached:
// every function is thread-safe.

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/numa/numa_topology.h"

namespace trident::numa {

// How strictly future allocations of the bound threads stay on the node.
enum class MemoryPolicy {
  // MPOL_BIND: pages come only from the node; when it is full the allocation
  // fails (the kernel's OOM handling applies) instead of going remote. The
  // default: the attention service exists to read KV at its node's local
  // bandwidth, and a silent spill to a remote node halves that bandwidth
  // without any error, which is far harder to diagnose than a failure.
  kBind,
  // MPOL_PREFERRED: pages come from the node while it has free memory, then
  // from others. For processes that would rather run slower than fail.
  kPreferred,
};

// The memory policy and node mask of the calling thread (get_mempolicy with
// no flags), for tests and start-up logs.
struct ThreadMemoryPolicy {
  int mode = 0;            // MPOL_DEFAULT, MPOL_BIND, MPOL_PREFERRED, ... (<numaif.h>).
  std::vector<int> nodes;  // The policy's node mask, ascending; empty for MPOL_DEFAULT.
};

// Sets the calling thread's memory policy for future allocations to `policy`
// on `node` (set_mempolicy), and its CPU affinity to the node's CPUs that the
// current affinity mask allows (sched_setaffinity); threads it creates later
// inherit both. Pages already allocated do not move. Without NUMA support
// (`topology.numa_available()` false) only the affinity is set: node 0 is the
// whole machine. Logs the binding.
//
// Returns kInvalidArgument if `node` does not exist (naming the nodes that
// do); kFailedPrecondition if the affinity mask allows none of its CPUs;
// kInternal if a system call fails (nothing is undone: the memory policy may
// be set while the affinity is not).
absl::Status BindProcessToNode(const NumaTopology& topology, int node,
                               MemoryPolicy policy = MemoryPolicy::kBind);

// The calling thread's memory policy. kInternal if get_mempolicy fails; with
// no NUMA support, {MPOL_DEFAULT, {}}.
absl::StatusOr<ThreadMemoryPolicy> GetThreadMemoryPolicy();

// The node holding the page at `address` (get_mempolicy with MPOL_F_NODE |
// MPOL_F_ADDR). Ask about written pages only: for a page not present the
// kernel maps it for reading first, which for untouched anonymous memory is
// the shared zero page, and answers with that page's node. Without NUMA
// support, 0. kInvalidArgument if `address` is not mapped; kInternal for any
// other failure.
absl::StatusOr<int> NodeOfAddress(const void* address);

// The node of each page of [address, address + length_bytes), in order, from
// move_pages(pid 0, nodes = nullptr), which neither moves nor faults pages in.
// `address` is rounded down to its page. Each entry is a node id >= 0, or a
// negative errno for that page: -ENOENT when the page is not present (never
// touched), -EFAULT when it is not mapped. Without NUMA support every present
// page reads as node 0. kInvalidArgument if `length_bytes` is 0; kInternal if
// move_pages fails as a whole.
absl::StatusOr<std::vector<int>> NodesOfPages(const void* address, size_t length_bytes);

}  // namespace trident::numa

#endif  // TRIDENT_COMMON_NUMA_NUMA_BINDING_H_
