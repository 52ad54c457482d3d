#include "common/numa/numa_arena.h"

#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/numa/numa_topology.h"
#include "common/numa/range_allocator.h"
#include "common/numa/spin_pool.h"

namespace trident::numa {
namespace {

// Transparent huge pages are 2 MiB on x86-64; the mapping starts on such a
// boundary so that every one of its 2 MiB blocks can be a huge page.
constexpr int64_t kHugePageBytes = int64_t{2} << 20;

int64_t RoundUp(int64_t value, int64_t unit) { return (value + unit - 1) / unit * unit; }

absl::Status ErrnoStatus(absl::string_view what, int error) {
  const std::string message = absl::StrCat("NumaArena: ", what, ": ", std::strerror(error));
  if (error == ENOMEM || error == EAGAIN || error == EPERM) {
    return absl::ResourceExhaustedError(message);
  }
  return absl::InternalError(message);
}

// Maps `bytes` of anonymous memory starting on a kHugePageBytes boundary.
absl::StatusOr<void*> MapAligned(int64_t bytes) {
  const size_t padded = static_cast<size_t>(bytes + kHugePageBytes);
  void* raw = mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return ErrnoStatus(absl::StrCat("mmap(", bytes, " bytes)"), errno);
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePageBytes - 1) & ~uintptr_t{kHugePageBytes - 1};
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + padded;
  const uintptr_t aligned_end = aligned + static_cast<uintptr_t>(bytes);
  if (end > aligned_end) munmap(reinterpret_cast<void*>(aligned_end), end - aligned_end);
  return reinterpret_cast<void*>(aligned);
}

absl::Status BindToNode(void* base, int64_t bytes, int node) {
  std::vector<unsigned long> mask(node / (8 * sizeof(unsigned long)) + 1, 0);
  mask[node / (8 * sizeof(unsigned long))] |= 1UL << (node % (8 * sizeof(unsigned long)));
  if (mbind(base, static_cast<unsigned long>(bytes), MPOL_BIND, mask.data(),
            mask.size() * 8 * sizeof(unsigned long) + 1, MPOL_MF_STRICT) != 0) {
    return ErrnoStatus(absl::StrCat("mbind(MPOL_BIND, node ", node, ")"), errno);
  }
  return absl::OkStatus();
}

// Writes one byte of every page of [begin, end): the write faults the page
// in, on the node the mapping is bound to. (A read would only map the shared
// zero page.)
void TouchPages(char* begin, char* end, int64_t page_bytes) {
  for (char* page = begin; page < end; page += page_bytes) {
    *reinterpret_cast<volatile char*>(page) = 0;
  }
}

void Prefault(char* base, int64_t bytes, int64_t page_bytes, SpinPool* pool) {
  if (pool == nullptr) {
    TouchPages(base, base + bytes, page_bytes);
    return;
  }
  // Slices of whole huge pages, so no two threads fault in one huge page.
  const int n = pool->num_threads();
  const int64_t blocks = (bytes + kHugePageBytes - 1) / kHugePageBytes;
  pool->Run([&](int thread) {
    const int64_t first = blocks * thread / n * kHugePageBytes;
    const int64_t last = std::min(bytes, blocks * (thread + 1) / n * kHugePageBytes);
    if (first < last) TouchPages(base + first, base + last, page_bytes);
  });
}

absl::Status CheckNodeMemory(const NumaTopology& topology, int node, int64_t bytes) {
  if (!topology.numa_available()) return absl::OkStatus();
  long long free_bytes = 0;
  const long long total_bytes = numa_node_size64(node, &free_bytes);
  if (total_bytes >= 0 && bytes > total_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("NumaArena: ", bytes, " bytes asked of node ",
                                                     node, ", which has ", total_bytes,
                                                     " bytes in all (", free_bytes, " free)"));
  }
  if (total_bytes >= 0 && bytes > free_bytes) {
    TRIDENT_LOG(WARNING) << "NumaArena: " << bytes << " bytes asked of node " << node
                         << ", which has " << free_bytes
                         << " bytes free; the rest must come from reclaim";
  }
  return absl::OkStatus();
}

}  // namespace

NumaArena::NumaArena(void* base, int node, int64_t capacity_bytes, int64_t alignment_bytes)
    : base_(base), node_(node), ranges_(capacity_bytes, alignment_bytes) {}

NumaArena::~NumaArena() { munmap(base_, static_cast<size_t>(ranges_.capacity_bytes())); }

absl::StatusOr<std::unique_ptr<NumaArena>> NumaArena::Create(const NumaTopology& topology,
                                                             const NumaArenaOptions& options) {
  if (absl::StatusOr<const NumaNode*> node = topology.Node(options.node); !node.ok()) {
    return node.status();
  }
  if (options.capacity_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NumaArena: capacity_bytes is ", options.capacity_bytes, "; want > 0"));
  }
  const int64_t alignment = options.alignment_bytes;
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NumaArena: alignment_bytes ", alignment, " is not a power of two"));
  }
  const int64_t page_bytes = sysconf(_SC_PAGESIZE);
  const int64_t capacity =
      RoundUp(options.capacity_bytes, std::max<int64_t>(page_bytes, alignment));
  if (absl::Status memory = CheckNodeMemory(topology, options.node, capacity); !memory.ok()) {
    return memory;
  }
  absl::StatusOr<void*> base = MapAligned(capacity);
  if (!base.ok()) return base.status();
  // Owns the mapping from here on, so every error path unmaps it.
  std::unique_ptr<NumaArena> arena(new NumaArena(*base, options.node, capacity, alignment));
  if (topology.numa_available()) {
    if (absl::Status bound = BindToNode(*base, capacity, options.node); !bound.ok()) return bound;
  }
  if (options.huge_pages && madvise(*base, capacity, MADV_HUGEPAGE) != 0) {
    TRIDENT_LOG(WARNING) << "NumaArena: madvise(MADV_HUGEPAGE): " << std::strerror(errno)
                         << "; using small pages";
  }
  Prefault(static_cast<char*>(*base), capacity, page_bytes, options.prefault_pool);
  // After the prefault, so that mlock (which faults pages in itself) finds
  // them present and the pool did the work.
  if (options.lock && mlock(*base, capacity) != 0) {
    return ErrnoStatus(absl::StrCat("mlock(", capacity, " bytes; see RLIMIT_MEMLOCK)"), errno);
  }
  TRIDENT_LOG(INFO) << "NumaArena: " << capacity << " bytes on node " << options.node
                    << (options.huge_pages ? ", huge pages advised" : "")
                    << (options.lock ? ", locked" : "") << ", pre-faulted by "
                    << (options.prefault_pool == nullptr
                            ? std::string("the calling thread")
                            : absl::StrCat(options.prefault_pool->num_threads(), " pool threads"));
  return arena;
}

}  // namespace trident::numa
