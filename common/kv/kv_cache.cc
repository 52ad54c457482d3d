#include "common/kv/kv_cache.h"

#include <numa.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/status/error_details.h"
#include "common/status/status_macros.h"

namespace trident::kv {
namespace {

constexpr size_t kHugePageBytes = size_t{2} << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<HostKvCache>> HostKvCache::Create(const KvCacheSpec& spec,
                                                                 absl::optional<int> numa_node) {
  TRIDENT_RETURN_IF_ERROR(Validate(spec));
  if (spec.num_blocks < 1) {
    return InvalidArgumentForField("kv_cache.num_blocks", "is 0; a cache needs at least 1 block");
  }
  if (numa_node.has_value()) {
    if (numa_available() < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("NUMA node ", *numa_node, " requested but the system has no NUMA support"));
    }
    if (*numa_node < 0 || *numa_node > numa_max_node()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "NUMA node ", *numa_node, " does not exist; nodes are 0 to ", numa_max_node()));
    }
  }

  const size_t size_bytes = spec.TotalBytes();
  const bool huge = size_bytes >= kHugePageBytes;
  // For 2 MiB alignment, map one huge page more than needed and unmap the
  // unaligned head and the tail.
  const size_t request_bytes = huge ? size_bytes + kHugePageBytes : size_bytes;
  void* mapping =
      mmap(nullptr, request_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", size_bytes, " bytes for the KV cache: ", std::strerror(errno)));
  }
  char* base = static_cast<char*>(mapping);
  size_t mapping_bytes = request_bytes;
  if (huge) {
    const uintptr_t addr = reinterpret_cast<uintptr_t>(mapping);
    const uintptr_t aligned = (addr + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
    const size_t head = aligned - addr;
    // size_bytes may not be a page multiple; the tail starts at the next page.
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t used = (size_bytes + page - 1) / page * page;
    if (head > 0) munmap(mapping, head);
    if (request_bytes - head > used) {
      munmap(reinterpret_cast<char*>(aligned) + used, request_bytes - head - used);
    }
    base = reinterpret_cast<char*>(aligned);
    mapping = base;
    mapping_bytes = used;
    // Best effort: without THP the cache works on 4 KiB pages, just with
    // more TLB misses.
    if (madvise(base, mapping_bytes, MADV_HUGEPAGE) != 0) {
      TRIDENT_LOG(WARNING) << "madvise(MADV_HUGEPAGE) failed for the KV cache: "
                           << std::strerror(errno);
    }
  }
  if (numa_node.has_value()) {
    // Sets the policy before any page is touched, so every page faults in on
    // the node.
    numa_tonode_memory(base, mapping_bytes, *numa_node);
  }
  return std::unique_ptr<HostKvCache>(
      new HostKvCache(spec, base, size_bytes, mapping, mapping_bytes, numa_node));
}

HostKvCache::HostKvCache(const KvCacheSpec& spec, char* base, size_t size_bytes, void* mapping,
                         size_t mapping_bytes, absl::optional<int> numa_node)
    : spec_(spec),
      base_(base),
      size_bytes_(size_bytes),
      mapping_(mapping),
      mapping_bytes_(mapping_bytes),
      numa_node_(numa_node) {}

HostKvCache::~HostKvCache() { munmap(mapping_, mapping_bytes_); }

}  // namespace trident::kv
