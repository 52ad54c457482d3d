#include "common/numa/numa_binding.h"

#include <numa.h>
#include <numaif.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging/log.h"
#include "common/numa/numa_topology.h"

namespace trident::numa {
namespace {

// The word type of the node masks that the memory-policy system calls take.
using NodeWord = unsigned long;
constexpr int kBitsPerWord = 8 * sizeof(NodeWord);

// A node mask as the memory-policy system calls take it, sized for every
// node the kernel may report.
struct NodeMask {
  std::vector<NodeWord> words;
  NodeWord max_node() const { return words.size() * kBitsPerWord; }
};

NodeMask EmptyNodeMask() {
  const int possible = numa_available() >= 0 ? numa_num_possible_nodes() : 1;
  return NodeMask{std::vector<NodeWord>((possible + kBitsPerWord - 1) / kBitsPerWord + 1, 0)};
}

absl::Status ErrnoStatus(absl::string_view what, int error) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  if (error == EFAULT) return absl::InvalidArgumentError(message);
  return absl::InternalError(message);
}

}  // namespace

absl::Status BindProcessToNode(const NumaTopology& topology, int node, MemoryPolicy policy) {
  absl::StatusOr<std::vector<int>> cpus = topology.Cpus(node);
  if (!cpus.ok()) return cpus.status();
  if (topology.numa_available()) {
    NodeMask mask = EmptyNodeMask();
    mask.words[node / kBitsPerWord] |= NodeWord{1} << (node % kBitsPerWord);
    const int mode = policy == MemoryPolicy::kBind ? MPOL_BIND : MPOL_PREFERRED;
    if (set_mempolicy(mode, mask.words.data(), mask.max_node()) != 0) {
      return ErrnoStatus(absl::StrCat("set_mempolicy(node ", node, ")"), errno);
    }
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : *cpus) CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return ErrnoStatus(absl::StrCat("sched_setaffinity(node ", node, ")"), errno);
  }
  TRIDENT_LOG(INFO) << "bound to NUMA node " << node << ": memory policy "
                    << (!topology.numa_available()      ? "unchanged (no NUMA support)"
                        : policy == MemoryPolicy::kBind ? "MPOL_BIND"
                                                        : "MPOL_PREFERRED")
                    << ", CPUs " << absl::StrJoin(*cpus, ",");
  return absl::OkStatus();
}

absl::StatusOr<ThreadMemoryPolicy> GetThreadMemoryPolicy() {
  if (numa_available() < 0) return ThreadMemoryPolicy{MPOL_DEFAULT, {}};
  NodeMask mask = EmptyNodeMask();
  int mode = 0;
  if (get_mempolicy(&mode, mask.words.data(), mask.max_node(), nullptr, 0) != 0) {
    return ErrnoStatus("get_mempolicy", errno);
  }
  ThreadMemoryPolicy result;
  result.mode = mode;
  for (NodeWord node = 0; node < mask.max_node(); ++node) {
    if (mask.words[node / kBitsPerWord] & (NodeWord{1} << (node % kBitsPerWord))) {
      result.nodes.push_back(static_cast<int>(node));
    }
  }
  return result;
}

absl::StatusOr<int> NodeOfAddress(const void* address) {
  if (numa_available() < 0) return 0;
  int node = -1;
  if (get_mempolicy(&node, nullptr, 0, const_cast<void*>(address), MPOL_F_NODE | MPOL_F_ADDR) !=
      0) {
    return ErrnoStatus(absl::StrFormat("get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR, %p)", address),
                       errno);
  }
  return node;
}

absl::StatusOr<std::vector<int>> NodesOfPages(const void* address, size_t length_bytes) {
  if (length_bytes == 0) return absl::InvalidArgumentError("NodesOfPages: length_bytes is 0");
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(address) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(address) + length_bytes;
  const size_t count = (end - first + page - 1) / page;
  std::vector<void*> pages(count);
  for (size_t i = 0; i < count; ++i) pages[i] = reinterpret_cast<void*>(first + i * page);
  std::vector<int> status(count, 0);
  if (numa_available() < 0) {
    // No NUMA: mincore says which pages are present; all of them are node 0.
    std::vector<unsigned char> present(count, 0);
    if (mincore(pages[0], count * page, present.data()) != 0) {
      if (errno == ENOMEM) return absl::InvalidArgumentError("NodesOfPages: range not mapped");
      return ErrnoStatus("mincore", errno);
    }
    for (size_t i = 0; i < count; ++i) status[i] = (present[i] & 1) ? 0 : -ENOENT;
    return status;
  }
  if (move_pages(0, count, pages.data(), nullptr, status.data(), 0) != 0) {
    return ErrnoStatus("move_pages", errno);
  }
  return status;
}

}  // namespace trident::numa
